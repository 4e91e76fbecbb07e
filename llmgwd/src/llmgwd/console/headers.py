"""The console's security headers: a strict Content-Security-Policy (no inline script or style),
no sniffing, no referrer, pages never cached, and HSTS where the client port has TLS."""

from __future__ import annotations

from aiohttp import web

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
HSTS = "max-age=31536000"  # a year: the client port has TLS, never come back without it
TLS = web.AppKey("llmgw.console.tls", bool)  # the client port has TLS


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every console answer (on_response_prepare: pages, redirects, refusals and aiohttp's own
    500 alike) stamped with HEADERS; all but static files never cached."""
    response.headers.update(HEADERS)
    if request.config_dict.get(TLS, False):
        response.headers["Strict-Transport-Security"] = HSTS
    if not request.path.startswith("/console/static/"):  # a page holds what this person sees
        response.headers["Cache-Control"] = "no-store"
