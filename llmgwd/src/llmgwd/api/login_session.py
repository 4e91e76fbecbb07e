"""What both sign-in routes share (/login/oidc and /login/device): the application's keys, a
sign-in refusal in the one error body, and a checked ID token's claims turned into the user's
session key with a bounded life."""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp import web

from llmgw.api_types import LoginAnswer
from llmgw.errors import ApiError
from llmgwd.catalog import ApiKey, Catalog, KeyOwner
from llmgwd.people.oidc import Provider, SignInError
from llmgwd.people.signin import SignIn

log = logging.getLogger(__name__)

OIDC = web.AppKey("llmgw.login.oidc", Provider)
SIGNIN = web.AppKey("llmgw.login.signin", SignIn)
KEYS = web.AppKey("llmgw.login.keys", Catalog)
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    409: "conflict_error",
}


def refuse(e: SignInError) -> ApiError:
    """A sign-in's refusal as an API error (its message names no token)."""
    return ApiError(e.status, str(e), _TYPES.get(e.status, "server_error"), e.code)


def off() -> ApiError:
    """The answer when no provider is set up."""
    return ApiError(
        404,
        "sign-in with OIDC is not set up here (oidc.issuer in server.yaml)",
        "not_found_error",
        "oidc_off",
    )


def parts(request: web.Request) -> tuple[Provider, SignIn]:
    """The provider and the sign-in, or the 404 when OIDC is off."""
    provider, signin = request.app.get(OIDC), request.app.get(SIGNIN)
    if provider is None or signin is None:
        raise off()
    return provider, signin


async def new_session(
    provider: Provider, signin: SignIn, keys: Catalog, claims: dict[str, Any]
) -> tuple[ApiKey, LoginAnswer]:
    """The user of a checked ID token's claims (made or updated, with the group rules'
    memberships) and a key of theirs that ends after the settings' session_ttl_s; the console's
    OIDC sign-in makes its session the same way (SignInError: refused)."""
    user = await signin.user_for(claims)
    expires_at = time.time() + provider.settings.session_ttl_s
    keys.note_user(user)  # a new user's key works here at once, before the watch
    made, key = await keys.create_key(
        f"login {user.name}", owner=KeyOwner(user=user.id), expires_at=expires_at
    )
    log.info("oidc: user %s (%s) signed in", user.id, user.name)
    return made, LoginAnswer(user=user.id, name=user.name, key=key, expires_at=expires_at)


async def session_for(request: web.Request, claims: dict[str, Any]) -> LoginAnswer:
    """new_session for a sign-in route, its refusal as an API error."""
    provider, signin = parts(request)
    try:
        _, answer = await new_session(provider, signin, request.app[KEYS], claims)
    except SignInError as e:
        raise refuse(e) from None
    return answer
