"""The console's security headers: a strict Content-Security-Policy (no inline script or style),
no sniffing, no referrer, and pages never cached."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def _stamp(response: web.StreamResponse, static: bool) -> None:
    response.headers.update(HEADERS)
    if not static:  # a page (or a redirect) holds what this person may see: never kept
        response.headers["Cache-Control"] = "no-store"


@web.middleware
async def security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every console answer, error pages and redirects included, with HEADERS."""
    static = request.path.startswith("/console/static/")
    try:
        response = await handler(request)
    except web.HTTPException as e:
        _stamp(e, static)
        raise
    _stamp(response, static)
    return response
