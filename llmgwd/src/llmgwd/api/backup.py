"""/api/v1's backup: POST /backup, the whole state of the cluster for `llmgw backup` to seal."""

from __future__ import annotations

from aiohttp import web

from llmgw.errors import ApiError
from llmgwd.api.base import api_context, json_response
from llmgwd.planes import backup


async def make_backup(request: web.Request) -> web.Response:
    """POST /backup: the store (SQLite's online backup, or every key of etcd's at one
    revision), the cluster CA and secret, this control plane's settings and the files they
    name (admins only)."""
    ctx = api_context(request)
    planes = ctx.control_planes
    if planes is None or planes.backup is None:
        raise ApiError(503, "this llmgwd makes no backups", "server_error", "no_backup")
    await ctx.usage.flush()  # the counts of the last seconds, not yet in the store, with it
    try:
        bundle = await backup.make(planes.backup)
    except backup.BackupFailed as e:
        raise ApiError(500, f"no backup: {e}", "server_error", "backup_failed") from None
    response = json_response(bundle)
    response.headers["Cache-Control"] = "no-store"
    return response
