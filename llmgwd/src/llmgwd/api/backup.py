"""/api/v1's backup: POST /backup, the whole state of the cluster for `llmgw backup` to seal."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from llmgw.errors import ApiError
from llmgwd.api.access import private_path
from llmgwd.api.base import api_context, caller, json_response
from llmgwd.planes import backup

log = logging.getLogger("llmgwd.api.backup")

# One backup at a time on a control plane: each holds the whole store in memory, twice.
_MAKING = asyncio.Lock()


async def make_backup(request: web.Request) -> web.Response:
    """POST /backup: the store (SQLite's online backup, or every key of etcd's at one
    revision), the cluster CA and secret, this control plane's settings and the files they
    name (admins only; over TLS, the Unix socket or loopback, one at a time)."""
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
            bundle = await backup.make(planes.backup)
        except backup.BackupFailed as e:
            raise ApiError(500, f"no backup: {e}", "server_error", "backup_failed") from None
        # Encoding the whole store (base64 in JSON) is off the event loop.
        response = await asyncio.to_thread(json_response, bundle)
    response.headers["Cache-Control"] = "no-store"
    return response
