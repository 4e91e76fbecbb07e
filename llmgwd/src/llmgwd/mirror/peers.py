"""Mirror peers: this mirror copies every whole set another one holds, and drops what it drops."""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import urlsplit

import aiohttp
import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler

from llmgw import download, proxy, sources
from llmgw.blobstore import BlobStoreError
from llmgw.wire import ModelFile
from llmgwd.mirror import hub_client, hub_server
from llmgwd.mirror.records import Peer
from llmgwd.mirror.service import Mirror
from llmgwd.mirror.snapshot import EVERY, Scope, Snapshot

log = logging.getLogger(__name__)

SYNC_EVERY_S = 300.0
LISTING = "/api/llmgw/snapshots"  # an llmgw mirror's own route under /hf: its whole sets


class PeerError(ValueError):
    """A peer that cannot be added (the message is safe to show)."""


class Listed(msgspec.Struct, frozen=True, kw_only=True):
    """One whole set a mirror holds, every file with its sha256, and the refs naming it."""

    repo: str
    commit: str
    files: list[ModelFile]
    refs: list[str] = []
    last_modified: str = ""


def whole(mirror: Mirror, scope: Scope = EVERY) -> list[Listed]:
    """The sets this mirror holds whole, for its peers: of those a scope narrows, the files
    it shows (a user key: its models' sets)."""
    out = []
    for snap in filter(None, map(scope.view, mirror.records.snapshots())):
        if snap.files and all(f.sha256 and mirror.store.has(f.sha256) for f in snap.files):
            refs = sorted(
                r for r, c in mirror.records.refs_of(snap.repo).items() if c == snap.commit
            )
            out.append(
                Listed(
                    repo=snap.repo,
                    commit=snap.commit,
                    files=list(snap.files),
                    refs=refs,
                    last_modified=snap.last_modified,
                )
            )
    return out


def listing_handler(mirror: Mirror) -> Handler:
    """GET /hf/api/llmgw/snapshots: what the caller may see (hub_server.scope_of)."""

    async def handler(request: web.Request) -> web.Response:
        listed = whole(mirror, hub_server.scope_of(request))
        return web.Response(body=msgspec.json.encode(listed), content_type="application/json")

    return handler


def check_url(url: str) -> str:
    """A peer's /hf URL: http(s), a host, no query, no credentials in it."""
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port  # a bad port or bracket raises ValueError
    except ValueError:
        host = None
    if not host or parts.scheme not in ("http", "https"):
        raise PeerError(f"{url!r} is not an http(s):// URL of a mirror's /hf")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise PeerError("a peer's URL has no query, fragment or credentials (use --token-file)")
    return url.rstrip("/")


async def add(mirror: Mirror, url: str, token_file: str) -> Peer:
    """Record a peer and copy its sets now (in the background)."""
    peer = Peer(url=check_url(url), token_file=token_file, added_at=time.time())
    await mirror.records.put_peer(peer)
    task = asyncio.get_running_loop().create_task(sync(mirror, peer))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return peer


_tasks: set[asyncio.Task[None]] = set()


async def run(mirror: Mirror, every_s: float = SYNC_EVERY_S) -> None:
    """Copy from every peer, for ever."""
    while True:
        await asyncio.sleep(every_s)
        for peer in mirror.records.peers():
            await sync(mirror, peer)


async def sync(mirror: Mirror, peer: Peer) -> None:
    """Copy the peer's whole sets that this mirror lacks; drop those it copied from the peer
    that the peer no longer holds. The outcome is kept on the peer's record."""
    error = ""
    try:
        listed = await _list(mirror, peer)
        for item in listed:
            await _copy(mirror, peer, item)
        await _drop_gone(mirror, peer, {(i.repo, i.commit) for i in listed})
    except (aiohttp.ClientError, TimeoutError, msgspec.ValidationError, msgspec.DecodeError) as e:
        by_proxy = proxy.explain(e, mirror.settings.route, peer.url + LISTING)
        error = f"could not list its sets: {by_proxy or type(e).__name__}"
    except (download.DownloadError, BlobStoreError, PeerError) as e:
        error = str(e)
    if error:
        log.warning("mirror peer %s: %s", peer.url, error)
    now = msgspec.structs.replace(peer, last_sync=time.time(), last_error=error)
    if any(p.url == peer.url for p in mirror.records.peers()):
        await mirror.records.put_peer(now)


def _headers(peer: Peer) -> dict[str, str]:
    token = hub_client.read_token(peer.token_file) if peer.token_file else None
    return {"Authorization": f"Bearer {token}"} if token else {}


async def _list(mirror: Mirror, peer: Peer) -> list[Listed]:
    session, url = mirror.http(), peer.url + LISTING
    kw = mirror.settings.route.request_kw(url)
    async with session.get(url, headers=_headers(peer), allow_redirects=False, **kw) as r:
        if r.status != 200:
            raise PeerError(f"it answered {r.status} to the listing of its sets")
        items = msgspec.json.decode(await r.read(), type=list[Listed])
    for i in items:
        if not sources.REPO_RE.fullmatch(i.repo) or not sources.COMMIT_RE.fullmatch(i.commit):
            raise PeerError(f"it listed {i.repo!r}@{i.commit!r}, not a repository at a commit")
        if any(not sources.SHA256_RE.fullmatch(f.sha256) for f in i.files):
            raise PeerError(f"it listed {i.repo}@{i.commit[:12]} with a file lacking its sha256")
    return items


async def _copy(mirror: Mirror, peer: Peer, item: Listed) -> None:
    session, headers = mirror.http(), _headers(peer)
    for f in item.files:
        url = hub_client.resolve_url(peer.url, item.repo, item.commit, f.path)
        await mirror.downloads.get(session, url, f, headers=headers, route=mirror.settings.route)
    if mirror.records.snapshot(item.repo, item.commit) is None:
        snap = Snapshot(
            repo=item.repo,
            commit=item.commit,
            files=list(item.files),
            last_modified=item.last_modified,
            origin=peer.url,
        )
        await mirror.records.put_snapshot(snap)
        log.info("mirror: %s@%s copied from peer %s", item.repo, item.commit[:12], peer.url)
    for ref in item.refs:
        if mirror.records.ref(item.repo, ref) is None:
            await mirror.records.put_ref(item.repo, ref, item.commit)


async def _drop_gone(mirror: Mirror, peer: Peer, listed: set[tuple[str, str]]) -> None:
    for snap in mirror.records.snapshots():
        if snap.origin != peer.url or (snap.repo, snap.commit) in listed:
            continue
        await mirror.records.drop_snapshot(snap.repo, snap.commit)
        kept = mirror.files_in_use()
        freed = sum(mirror.store.remove(f.sha256) for f in snap.files if f.sha256 not in kept)
        log.info(
            "mirror: %s@%s dropped as peer %s dropped it (%d bytes freed)",
            snap.repo,
            snap.commit[:12],
            peer.url,
            freed,
        )
