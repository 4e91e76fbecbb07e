"""The mirror's files for the nodes and the other control planes, on the cluster port:
GET /mirror/files/{sha256}, ranges."""

from __future__ import annotations

import re
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from aiohttp import web

from llmgw import pki
from llmgw.errors import cluster_error

SHA256_RE = re.compile(r"[0-9a-f]{64}")
FILES = "/mirror/files/"  # + a sha256

# The admitted node a request's client certificate names, or the answer that refuses it
# (the cluster port checks a file request as it checks an agent's link).
Admit = Callable[[web.Request], Awaitable[str | web.Response]]


class Blobs(Protocol):
    """Where the mirror keeps its published files (the mirror service provides it)."""

    def blob(self, sha256: str) -> Path | None:
        """The published (checked) file with this sha256, or None if the mirror lacks it."""
        ...


def add_routes(app: web.Application, blobs: Blobs, admit: Admit) -> None:
    """GET (and HEAD) /mirror/files/{sha256} on the cluster port app."""
    app.router.add_get(FILES + "{sha256}", _Files(blobs, admit).get)


class _Files:
    def __init__(self, blobs: Blobs, admit: Admit) -> None:
        self._blobs = blobs
        self._admit = admit

    async def get(self, request: web.Request) -> web.StreamResponse:
        """A published file, whole or a Range of it (web.FileResponse answers ranges)."""
        if _plane(request) is None:  # another control plane's mirror copies from this one
            node = await self._admit(request)
            if isinstance(node, web.Response):
                return node
        sha256 = request.match_info["sha256"]
        if not SHA256_RE.fullmatch(sha256):
            return _error(404, f"{sha256[:80]!r} is not a sha256 (64 lowercase hex digits)")
        path = self._blobs.blob(sha256)
        if path is None or not path.is_file():
            return _error(404, f"the mirror does not have file {sha256}", "not_in_mirror")
        headers = {"Content-Type": "application/octet-stream", "Cache-Control": "no-store"}
        return web.FileResponse(path, headers=headers)


def _plane(request: web.Request) -> str | None:
    """The control plane a verified client certificate names (pki.make_plane_cert), if any."""
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    if not isinstance(ssl_object, ssl.SSLObject):
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return pki.plane_name_of(der) if der else None


def _error(status: int, message: str, code: str = "not_found") -> web.Response:
    """The cluster port's error shape."""
    return cluster_error(status, message, code)
