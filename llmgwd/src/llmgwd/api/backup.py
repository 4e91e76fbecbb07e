"""/api/v1's backup: POST /backup, the whole state of the cluster for `llmgw backup` to seal,
streamed from a copy of the store on disk (memory held does not grow with the store)."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator

import msgspec
from aiohttp import web

from llmgw import backup_archive as archive
from llmgw.errors import ApiError
from llmgwd.api.access import private_path
from llmgwd.api.base import api_context, caller
from llmgwd.planes import backup

log = logging.getLogger("llmgwd.api.backup")

# One backup at a time on a control plane: each makes a copy of the store on disk.
_MAKING = asyncio.Lock()
_PIECE = 3 << 18  # store bytes read at once (768 KiB: whole base64 groups)


async def make_backup(request: web.Request) -> web.StreamResponse:
    """POST /backup: the store (SQLite's online backup, or every key of etcd's at one
    revision), the cluster CA and secret, this control plane's settings and the files they
    name (admins only; over TLS, the Unix socket or loopback, one at a time). Streamed:
    as `backup_archive`'s stream where the Accept header names it (`llmgw backup`), else
    as the JSON of a BackupBundle, its store last."""
    ctx = api_context(request)
    planes = ctx.control_planes
    if planes is None or planes.backup is None:
        raise ApiError(503, "this llmgwd makes no backups", "server_error", "no_backup")
    if not private_path(request):
        raise ApiError(
            403,
            "a backup holds the cluster's CA key and secret: ask over https:// (or on the "
            "control plane's Unix socket), not plain http://",
            "permission_error",
            "tls_required",
        )
    if _MAKING.locked():
        raise ApiError(409, "a backup is being made already: try again when it is done",
                       "invalid_request_error", "backup_running")  # fmt: skip
    async with _MAKING:
        log.info("backup asked by %s from %s", caller(request), request.remote or "the socket")
        await ctx.usage.flush()  # the counts of the last seconds, not yet in the store, with it
        try:
            async with backup.dump(planes.backup) as made:
                return await _send(request, made)
        except backup.BackupFailed as e:
            raise ApiError(500, f"no backup: {e}", "server_error", "backup_failed") from None


async def _send(request: web.Request, made: backup.Dump) -> web.StreamResponse:
    """The backup as a chunked answer, a piece at a time (a failure midway breaks it off,
    which the client sees as a body cut short)."""
    streamed = archive.MEDIA_TYPE in request.headers.get("Accept", "")
    response = web.StreamResponse(headers={"Cache-Control": "no-store"})
    response.content_type = archive.MEDIA_TYPE if streamed else "application/json"
    response.enable_chunked_encoding()
    await response.prepare(request)
    pieces = _archive(made) if streamed else _json(made)
    async for piece in pieces:
        await response.write(piece)
    await response.write_eof()
    return response


async def _store(made: backup.Dump) -> AsyncIterator[bytes]:
    """The store file, _PIECE at a time, read off the event loop; its announced length."""
    left = made.store_bytes
    while left:
        piece = await asyncio.to_thread(made.store.read, min(_PIECE, left))
        if not piece:
            raise backup.BackupFailed(f"the store's copy ended {left} bytes short")
        left -= len(piece)
        yield piece


async def _archive(made: backup.Dump) -> AsyncIterator[bytes]:
    """The backup as `backup_archive`'s stream: its head, then the store."""
    yield archive.head(made.bundle, made.store_bytes)
    async for piece in _store(made):
        yield piece


async def _json(made: backup.Dump) -> AsyncIterator[bytes]:
    """A BackupBundle's JSON, its store (base64) last, written as it is read."""
    fields = msgspec.to_builtins(made.bundle)
    del fields["store"]
    yield msgspec.json.encode(fields)[:-1] + b',"store":"'
    async for piece in _store(made):
        yield base64.b64encode(piece)
    yield b'"}'
