"""/api/v1's mirror: its status, imports of local directories, sweeps and peers."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from llmgw import sources
from llmgw.api_types import ImportIn, ImportOut, PeerIn, PeerView, SweepIn, SweepOut, UploadView
from llmgw.blobstore import BlobStoreError, ChecksumMismatch, DiskFull
from llmgw.errors import ApiError
from llmgwd.api.base import (
    ApiContext,
    api_context,
    bad_field,
    caller,
    json_response,
    read_body,
)
from llmgwd.catalog import Model
from llmgwd.mirror import imports, sweep
from llmgwd.mirror.service import Mirror
from llmgwd.upgrade import records as upgrade_records

log = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 1 << 40  # one file of an import: 1 TiB
STOP_WAIT_S = 30.0  # how long `model remove --files` waits for the model's replicas to stop


def _mirror(ctx: ApiContext) -> Mirror:
    if ctx.mirror is None:
        raise ApiError(503, "this llmgwd has no mirror", "server_error", "no_mirror")
    return ctx.mirror


async def get_mirror(request: web.Request) -> web.Response:
    """GET /mirror: what the mirror holds, its sets in flight and its peers (and, among
    several control planes, which holds each model's set)."""
    ctx = api_context(request)
    mirror = _mirror(ctx)
    status = mirror.status()
    if mirror.fleet is not None:
        used = [m.source for m in ctx.catalog.all() if sources.is_hf(m.source) and m.files]
        status.held = await mirror.fleet.held(used)
    return json_response(status)


async def put_upload(request: web.Request) -> web.Response:
    """PUT /mirror/uploads/{sha256}: one file of an import, checked before it is published."""
    mirror = _mirror(api_context(request))
    sha = request.match_info["sha256"]
    if not sources.SHA256_RE.fullmatch(sha):
        raise bad_field("sha256", "must be 64 lowercase hex digits")
    size = request.content_length
    if size is None or not 0 <= size <= MAX_UPLOAD_BYTES:
        raise ApiError(411, "an upload needs its Content-Length", "invalid_request_error", "length")
    try:
        await imports.receive(mirror.store, sha, size, request.content.iter_chunked(1 << 20))
    except DiskFull as e:
        raise ApiError(507, str(e), "server_error", "disk_full") from None
    except ChecksumMismatch as e:
        raise ApiError(400, str(e), "invalid_request_error", "checksum_mismatch") from None
    except BlobStoreError as e:  # the same file being uploaded by another import
        raise ApiError(409, str(e), "conflict_error", "upload_in_progress") from None
    return json_response(UploadView(sha256=sha, size=size), 201)


async def post_import(request: web.Request) -> web.Response:
    """POST /mirror/import: record uploaded files as ORG/REPO at a commit of their own."""
    ctx = api_context(request)
    mirror = _mirror(ctx)
    body = await read_body(request, ImportIn, limit=16 << 20)
    try:
        snap = await imports.record(body, mirror.store, mirror.records)
    except imports.ImportRefused as e:
        raise ApiError(400, str(e), "invalid_request_error", "import_refused") from None
    log.info(
        "mirror: %s imported as %s@%s (%d files) by %s",
        body.revision,
        snap.repo,
        snap.commit[:12],
        len(snap.files),
        caller(request),
    )
    out = ImportOut(
        repo=snap.repo,
        commit=snap.commit,
        revision=body.revision,
        files=len(snap.files),
        bytes=sum(f.size for f in snap.files),
    )
    return json_response(out, 201)


def _used(ctx: ApiContext, leaving: str = "") -> set[str]:
    return sweep.used_by(m.files for m in ctx.catalog.all() if m.name != leaving)


async def sweep_files(
    ctx: ApiContext, dry_run: bool, only: set[str] | None = None, leaving: str = ""
) -> SweepOut:
    """Delete (or list) what no model uses on the mirror and on every node."""
    mirror = _mirror(ctx)
    used = _used(ctx, leaving)
    used |= {p.sha256 for p in await upgrade_records.staged(ctx.catalog.store)}  # llmgw upgrade's
    try:
        out = sweep.mirror_part(mirror.store, used, only, dry_run)
    except BlobStoreError as e:
        raise ApiError(500, str(e), "server_error", "sweep_failed") from None
    if mirror.fleet is not None and not dry_run:
        models = (m for m in ctx.catalog.all() if m.name != leaving)
        await mirror.fleet.swept({m.source for m in models if sources.is_hf(m.source)})
    if ctx.node_files is not None:
        out.nodes = await sweep.nodes_part(ctx.node_files, used, only, dry_run)
    return out


async def post_sweep(request: web.Request) -> web.Response:
    """POST /mirror/sweep {dry_run}: files no model uses, deleted on the mirror and nodes."""
    ctx = api_context(request)
    body = await read_body(request, SweepIn)
    out = await sweep_files(ctx, body.dry_run)
    if not body.dry_run:
        log.info(
            "mirror sweep by %s: %d files, %d bytes on the mirror",
            caller(request),
            out.files,
            out.bytes,
        )
    return json_response(out)


async def remove_files_of(ctx: ApiContext, model: Model) -> SweepOut:
    """After `model remove --files`: the model's files no other model uses, everywhere,
    once its replicas have stopped (a node keeps files a replica it runs uses)."""
    only = {f.sha256 for f in model.files if f.sha256}
    await _until_stopped(ctx, model.name)
    return await sweep_files(ctx, False, only=only, leaving=model.name)


async def _until_stopped(ctx: ApiContext, name: str) -> None:
    """Wait (a bounded while) until no connected node reports a replica of the model."""
    for _ in range(int(STOP_WAIT_S / 0.25)):
        running = [
            r for n in ctx.nodes.nodes() if n.connected for r in n.replicas if r.model == name
        ]
        if not running:
            return
        await asyncio.sleep(0.25)
    log.warning("model %s: replicas still reported after %g s; sweeping anyway", name, STOP_WAIT_S)


async def get_peers(request: web.Request) -> web.Response:
    """GET /mirror/peers"""
    return json_response(_mirror(api_context(request)).status().peers)


async def post_peer(request: web.Request) -> web.Response:
    """POST /mirror/peers {url, token_file}: copy another mirror's sets into this one."""
    ctx = api_context(request)
    body = await read_body(request, PeerIn)
    from llmgwd.mirror import peers

    try:
        peer = await peers.add(_mirror(ctx), body.url, body.token_file)
    except peers.PeerError as e:
        raise bad_field("url", str(e)) from None
    log.info("mirror peer %s added by %s", peer.url, caller(request))
    view = PeerView(
        url=peer.url, last_sync=peer.last_sync, last_error=peer.last_error, as_peer=ctx.as_peer
    )  # a mirror alone also says how others copy from it
    return json_response(view, 201)
