"""/api/v1's two ways of auth: the Unix socket's peer credentials and an admin key."""

from __future__ import annotations

from typing import NoReturn

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmgw.localsock import allowed, peer_credentials
from llmgwd.api.base import PRINCIPAL, ApiError, KeyLookup

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="llmgw"'}


def _deny(status: int, message: str, code: str) -> NoReturn:
    if status == 401:
        raise ApiError(401, message, "authentication_error", code, headers=_CHALLENGE)
    raise ApiError(status, message, "permission_error", code)


def peercred_auth(group: str) -> Middleware:
    """Auth for the Unix socket: the caller's kernel-given credentials, no key."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        cred = peer_credentials(request)
        if cred is None:
            _deny(403, "this API answers local callers on its Unix socket only", "not_local")
        pid, uid, gid = cred
        if not allowed(uid, gid, group):
            _deny(403, f"uid {uid} is neither root nor in the {group} group", "not_allowed")
        request[PRINCIPAL] = f"uid {uid} (pid {pid})"
        return await handler(request)

    return middleware


def _bearer(request: web.Request) -> str | None:
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    return secret.strip() or None if scheme.lower() == "bearer" else None


def key_auth(keys: KeyLookup) -> Middleware:
    """Auth for the client port: an admin API key as `Authorization: Bearer KEY`."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        secret = _bearer(request)
        if secret is None:
            _deny(401, "an admin API key is needed: Authorization: Bearer KEY", "missing_key")
        key = keys.authenticate(secret)
        if key is None:
            _deny(401, "the API key is not valid (or was revoked)", "invalid_key")
        if key.role != "admin":
            _deny(403, f"key {key.id} ({key.name}) is not an admin key", "not_admin")
        request[PRINCIPAL] = f"key {key.id} ({key.name})"
        return await handler(request)

    return middleware
