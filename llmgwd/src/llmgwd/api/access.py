"""/api/v1's auth: who calls (the Unix socket's peer credentials, or a key), and each route's
guard, which lets in only the principals its rule (llmgwd.auth) passes."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import NoReturn

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmgw.errors import ApiError
from llmgw.localsock import allowed, peer_credentials
from llmgwd import auth
from llmgwd.api.base import KeyLookup, api_context
from llmgwd.auth import Principal, Rule
from llmgwd.clientport import forwarded
from llmgwd.people.directory import Directory

RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="llmgw"'}


def _deny(status: int, message: str, code: str) -> NoReturn:
    if status == 401:
        raise ApiError(401, message, "authentication_error", code, headers=_CHALLENGE)
    raise ApiError(status, message, "permission_error", code)


def private_path(request: web.Request) -> bool:
    """Whether what a request carries stays off the network: it came over TLS, the Unix
    socket, or from this host (loopback). Where the client port also answers plain HTTP
    (llmgwd's own certificate), a route handing out secrets asks for one of these. Brought by
    a trusted proxy (client.trusted_proxies): the client's hop to it is what counts, as the
    proxy tells it (X-Forwarded-Proto, X-Forwarded-For), never the proxy's own to llmgwd."""
    if forwarded.proxied(request):
        return forwarded.forwarded_tls(request) or _loopback(forwarded.client_address(request))
    if request.secure:
        return True
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None and sock.family == socket.AF_UNIX:
        return True
    return _loopback(request.remote or "")


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def peercred_auth(group: str) -> Middleware:
    """Auth for the Unix socket: the caller's kernel-given credentials, no key; root and the
    group are staff admins."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        cred = peer_credentials(request)
        if cred is None:
            _deny(403, "this API answers local callers on its Unix socket only", "not_local")
        pid, uid, gid = cred
        if not allowed(uid, gid, group):
            _deny(403, f"uid {uid} is neither root nor in the {group} group", "not_allowed")
        request[auth.PRINCIPAL] = Principal(f"uid {uid} (pid {pid})", staff="admin")
        return await handler(request)

    return middleware


def _bearer(request: web.Request) -> str | None:
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    return secret.strip() or None if scheme.lower() == "bearer" else None


def key_auth(keys: KeyLookup) -> Middleware:
    """Auth for the client port: an API key as `Authorization: Bearer KEY`, resolved to its
    principal (auth.of_bearer: an admin key a staff admin, a person's key its maker's rights
    narrowed to its project); each route's guard then lets in whom its rule passes."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if _bearer(request) is None:
            _deny(401, "an API key is needed: Authorization: Bearer KEY", "missing_key")
        who = auth.of_bearer(request, keys)
        if who == auth.NOBODY:
            _deny(401, "the API key is not valid (or was revoked)", "invalid_key")
        request[auth.PRINCIPAL] = who
        return await handler(request)

    return middleware


def guarded(rule: Rule, handler: RouteHandler) -> RouteHandler:
    """handler, run only for a principal that passes rule (401 for nobody, else 403)."""

    async def run(request: web.Request) -> web.StreamResponse:
        catalog = api_context(request).catalog
        who = auth.principal_of(request, catalog)
        if not await auth.allowed(who, rule, request.match_info, Directory(catalog.store)):
            if who == auth.NOBODY:
                _deny(401, "an API key is needed: Authorization: Bearer KEY", "missing_key")
            _deny(403, f"{who.label} may not {request.method} {request.path}", "not_allowed")
        return await handler(request)

    return run
