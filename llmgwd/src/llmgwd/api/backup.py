"""/api/v1's backup: POST /backup, the whole state of the cluster for `llmgw backup` to seal."""

from __future__ import annotations

from aiohttp import web

from llmgw.errors import ApiError
from llmgwd.api.base import api_context, json_response
from llmgwd.planes import backup


async def make_backup(request: web.Request) -> web.Response:
    """POST /backup: the store (SQLite's online backup, or every key of etcd's at one
    revision), the cluster CA and secret and this control plane's settings (admins only)."""
    planes = api_context(request).control_planes
    if planes is None or planes.backup is None:
        raise ApiError(503, "this llmgwd makes no backups", "server_error", "no_backup")
    bundle = await backup.make(planes.backup)
    response = json_response(bundle)
    response.headers["Cache-Control"] = "no-store"
    return response
