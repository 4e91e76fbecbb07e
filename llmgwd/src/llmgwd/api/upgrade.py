"""/api/v1's upgrade: packages staged (kept by sha256 in the mirror's blob store, their headers
read here), and the roll started, shown, resumed or aborted (llmgw upgrade)."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from aiohttp import web

from llmgw import packages, sources, wire
from llmgw.api_types import StagedPackage, UpgradeRoll, UpgradeStartIn, UpgradeView
from llmgw.blobstore import BlobStoreError, ChecksumMismatch, DiskFull
from llmgw.errors import ApiError
from llmgwd.api.base import ApiContext, api_context, bad_field, caller, json_response, read_body
from llmgwd.mirror import imports
from llmgwd.mirror.service import Mirror
from llmgwd.nodes.members import Members
from llmgwd.planes import registry
from llmgwd.upgrade import records, roll

log = logging.getLogger(__name__)

MAX_PACKAGE_BYTES = 2 << 30
NAMES = frozenset({"llmgw", "llmgwd", "llmgw-agentd"})  # what `llmgw upgrade` installs


def _mirror(ctx: ApiContext) -> Mirror:
    if ctx.mirror is None:
        raise ApiError(503, "this llmgwd has no mirror to keep packages in", "server_error",
                       "no_mirror")  # fmt: skip
    return ctx.mirror


async def put_package(request: web.Request) -> web.Response:
    """PUT /upgrade/packages/{sha256}: a .deb or .rpm, checked, kept and recorded."""
    ctx = api_context(request)
    mirror = _mirror(ctx)
    sha = request.match_info["sha256"]
    if not sources.SHA256_RE.fullmatch(sha):
        raise bad_field("sha256", "must be 64 lowercase hex digits")
    size = request.content_length
    if size is None or not 0 < size <= MAX_PACKAGE_BYTES:
        raise ApiError(411, "a package needs its Content-Length (at most 2 GiB)",
                       "invalid_request_error", "length")  # fmt: skip
    try:
        await imports.receive(mirror.store, sha, size, request.content.iter_chunked(1 << 20))
    except DiskFull as e:
        raise ApiError(507, str(e), "server_error", "disk_full") from None
    except ChecksumMismatch as e:
        raise ApiError(400, str(e), "invalid_request_error", "checksum_mismatch") from None
    except BlobStoreError as e:
        raise ApiError(409, str(e), "conflict_error", "upload_in_progress") from None
    staged = await _read(mirror, sha, size)
    await records.stage(ctx.catalog.store, staged)
    log.info("upgrade: %s staged by %s (%s, %d bytes)", staged.filename, caller(request),
             sha[:12], size)  # fmt: skip
    return json_response(staged, 201)


async def _read(mirror: Mirror, sha: str, size: int) -> StagedPackage:
    """The package's own header, read from the kept file; one that is no llmgw package is
    refused and its bytes dropped."""
    try:
        info = await asyncio.to_thread(packages.read, mirror.store.path(sha))
        if info.name not in NAMES:
            raise packages.PackageError(f"{info.name} is not one of {', '.join(sorted(NAMES))}")
    except packages.PackageError as e:
        mirror.store.remove(sha)
        raise ApiError(400, str(e), "invalid_request_error", "not_a_package") from None
    version = info.version.split(":", 1)[-1]
    filename = (
        f"{info.name}_{version}_{info.arch}.deb"
        if info.kind == "deb"
        else f"{info.name}-{version}.{info.arch}.rpm"
    )
    return StagedPackage(
        kind=info.kind, name=info.name, version=info.version, arch=info.arch,
        release=info.release, sha256=sha, size=size, filename=filename, staged_at=time.time(),
    )  # fmt: skip


async def get_upgrade(request: web.Request) -> web.Response:
    """GET /upgrade: what is staged and the roll."""
    store = api_context(request).catalog.store
    current, _ = await records.roll(store)
    return json_response(UpgradeView(staged=await records.staged(store), roll=current))


async def start(request: web.Request) -> web.Response:
    """POST /upgrade/start: a new roll of the staged release (refused while one runs)."""
    ctx = api_context(request)
    body = await read_body(request, UpgradeStartIn)
    store = ctx.catalog.store
    if body.from_repositories:  # the host reports the release; apt-get or dnf is given all
        version = _repository_version(body.release)
        release = wire.release_of(version)
    else:
        version, release = "", _release(await records.staged(store), body.release)
    planes, _ = await registry.read(store)
    # The members the store knows (a standby's cluster state holds no agents), and any
    # connected here that joined before membership records were kept.
    known = set(await Members(store).active()) | {n.name for n in ctx.nodes.nodes()}
    nodes = sorted(known)
    if body.nodes is not None:
        unknown = sorted(set(body.nodes) - set(nodes))
        if unknown:
            raise bad_field("nodes", f"no node {', '.join(unknown)}")
        nodes = [n for n in nodes if n in body.nodes]
    plane_names = sorted(p.name for p in planes)
    new = roll.plan(secrets.token_hex(4), release, plane_names, nodes, parallel=body.parallel,
                    now=time.time(), from_repositories=body.from_repositories,
                    version=version if version != release else "")  # fmt: skip

    def replace(current: UpgradeRoll | None) -> UpgradeRoll:
        if current is not None and current.state in ("running", "halted"):
            why = f"roll {current.id} to {current.release} is {current.state}: resume or abort it"
            raise ApiError(409, why, "conflict_error", "roll_in_progress")
        return new

    started = await records.change(store, replace)
    log.info("upgrade %s to %s started by %s: %d hosts%s", new.id, release, caller(request),
             len(new.hosts), " from the repositories" if new.from_repositories else "")  # fmt: skip
    return json_response(started)


def _repository_version(wanted: str) -> str:
    """The version every host installs from its repositories: named, and only a version
    (it is given to apt-get and dnf)."""
    if not wanted:
        raise bad_field("release", "name the version to install from the repositories")
    if not wire.repository_version_ok(wanted):
        raise bad_field("release", "is not a package version (digits first; letters, digits "
                        "and . + ~ -)")  # fmt: skip
    return wanted


def _release(staged: list[StagedPackage], wanted: str) -> str:
    """The release to roll: the one asked (it must be staged), else the only one staged."""
    releases = sorted({p.release for p in staged})
    if wanted:
        if wanted not in releases:
            raise bad_field("release", f"{wanted} is not staged (staged: {releases or 'none'})")
        return wanted
    if len(releases) != 1:
        raise bad_field("release", f"name one of the staged releases: {releases or 'none'}")
    return releases[0]


async def act(request: web.Request) -> web.Response:
    """POST /upgrade/{action:resume|abort}: a halted roll carried on, or any roll stopped
    from starting another host."""
    ctx = api_context(request)
    action = request.match_info["action"]

    def change(current: UpgradeRoll | None) -> UpgradeRoll:
        if current is None:
            raise ApiError(404, "no roll was started", "not_found_error", "no_roll")
        if action == "abort" and current.state in ("running", "halted"):
            return roll.abort(current)
        if action == "resume" and current.state == "halted":
            return roll.resume(current, time.time())
        raise ApiError(409, f"roll {current.id} is {current.state}: nothing to {action}",
                       "conflict_error", "roll_state")  # fmt: skip

    changed = await records.change(ctx.catalog.store, change)
    log.info("upgrade %s: %s by %s", changed.id, action, caller(request))
    return json_response(changed)
