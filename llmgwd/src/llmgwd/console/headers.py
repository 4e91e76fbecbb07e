"""The console's security headers: a strict Content-Security-Policy (no inline script or style),
no sniffing, no referrer, pages never cached, and HSTS and https:// where the port has TLS."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from llmgwd.api.access import private_path

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


@web.middleware
async def to_https(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Plain HTTP from another host, where the client port has TLS (llmgwd's own certificate
    answers plain HTTP on the same port): sent to https://, where the session cookie is
    Secure and a key typed at sign-in never crosses the network in clear. This host's own
    browser (loopback) is served as it asks."""
    if request.config_dict.get(TLS, False) and not private_path(request):
        raise web.HTTPPermanentRedirect(request.url.with_scheme("https"))
    return await handler(request)
