"""/api/v1/login: sign-in with the site's OpenID Connect provider, open to callers without a
key (that is what they come for): GET what `llmgw login` needs, POST a sign-in's code or ID
token for a key of the user's with a bounded life."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from llmgw.api_types import LoginAnswer, OidcInfo, OidcLogin
from llmgw.config import Oidc
from llmgwd.api.base import ApiError, errors_middleware, json_response, read_body
from llmgwd.catalog import Catalog, KeyOwner
from llmgwd.people.oidc import Provider, SignInError
from llmgwd.people.signin import SignIn

log = logging.getLogger(__name__)

PREFIX = "/api/v1/login"  # mounted before /api/v1 on the client port, so no key is asked
OIDC = web.AppKey("llmgw.login.oidc", Provider)
SIGNIN = web.AppKey("llmgw.login.signin", SignIn)
KEYS = web.AppKey("llmgw.login.keys", Catalog)
_TYPES = {401: "authentication_error", 403: "permission_error", 409: "conflict_error"}


def _refuse(e: SignInError) -> ApiError:
    return ApiError(e.status, str(e), _TYPES.get(e.status, "server_error"), e.code)


def _off() -> ApiError:
    return ApiError(
        404,
        "sign-in with OIDC is not set up here (oidc.issuer in server.yaml)",
        "not_found_error",
        "oidc_off",
    )


async def get_oidc(request: web.Request) -> web.StreamResponse:
    """What `llmgw login` sends a person to: the provider's endpoint, client id, scopes."""
    provider = request.app.get(OIDC)
    if provider is None:
        raise _off()
    try:
        meta = await provider.metadata()
    except SignInError as e:
        raise _refuse(e) from None
    settings = provider.settings
    return json_response(
        OidcInfo(
            issuer=settings.issuer,
            authorization_endpoint=str(meta["authorization_endpoint"]),
            client_id=settings.client_id,
            scopes=list(settings.scopes),
        )
    )


async def post_oidc(request: web.Request) -> web.StreamResponse:
    """A sign-in: its ID token (traded for its code here, or given) checked, the user made or
    updated with the group rules' memberships, and a session key of theirs answered."""
    provider, signin = request.app.get(OIDC), request.app.get(SIGNIN)
    if provider is None or signin is None:
        raise _off()
    body = await read_body(request, OidcLogin)
    if not body.id_token and not (body.code and body.code_verifier and body.redirect_uri):
        raise ApiError(
            400,
            "body: give id_token, or code with code_verifier and redirect_uri",
            "invalid_request_error",
            "invalid_body",
            "body",
        )
    try:
        token = body.id_token or await provider.redeem(
            body.code, body.code_verifier, body.redirect_uri
        )
        claims = await provider.verify(token, body.nonce)
        user = await signin.user_for(claims)
    except SignInError as e:
        raise _refuse(e) from None
    expires_at = time.time() + provider.settings.session_ttl_s
    request.app[KEYS].note_user(user)  # a new user's key works here at once, before the watch
    _, key = await request.app[KEYS].create_key(
        f"login {user.name}", owner=KeyOwner(user=user.id), expires_at=expires_at
    )
    log.info("oidc: user %s (%s) signed in", user.id, user.name)
    answer = LoginAnswer(user=user.id, name=user.name, key=key, expires_at=expires_at)
    return json_response(answer)


def login_app(catalog: Catalog, settings: Oidc) -> web.Application:
    """The sign-in routes, to mount with parent.add_subapp(PREFIX, ...) before /api/v1."""
    app = web.Application(middlewares=[errors_middleware], client_max_size=64 * 1024)
    app[KEYS] = catalog
    if settings.issuer:
        app[OIDC] = Provider(settings)
        app[SIGNIN] = SignIn(catalog.store, settings)
    app.add_routes([web.get("/oidc", get_oidc), web.post("/oidc", post_oidc)])
    return app
