"""/api/v1/login: sign-in with the site's OpenID Connect provider, open to callers without a
key (that is what they come for): GET what `llmgw login` needs, POST a sign-in's code or ID
token for a key of the user's with a bounded life; the device grant's routes beside them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from llmgw import proxy
from llmgw.api_types import OidcInfo, OidcLogin
from llmgw.config import Oidc
from llmgw.errors import ApiError
from llmgwd.api import login_device
from llmgwd.api.base import errors_middleware, json_response, read_body
from llmgwd.api.login_session import KEYS, OIDC, SIGNIN, off, parts, refuse, session_for
from llmgwd.catalog import Catalog
from llmgwd.people.oidc import Provider, SignInError
from llmgwd.people.records import User
from llmgwd.people.signin import SignIn

PREFIX = "/api/v1/login"  # mounted before /api/v1 on the client port, so no key is asked


async def get_oidc(request: web.Request) -> web.StreamResponse:
    """What `llmgw login` sends a person to: the provider's endpoint, client id, scopes."""
    provider = request.app.get(OIDC)
    if provider is None:
        raise off()
    try:
        meta = await provider.metadata()
    except SignInError as e:
        raise refuse(e) from None
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
    provider, _ = parts(request)
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
    except SignInError as e:
        raise refuse(e) from None
    return json_response(await session_for(request, claims))


def login_app(
    catalog: Catalog,
    settings: Oidc,
    route: proxy.Route = proxy.DIRECT,
    after: Callable[[User], Awaitable[None]] | None = None,
) -> web.Application:
    """The sign-in routes, to mount with parent.add_subapp(PREFIX, ...) before /api/v1;
    the provider is asked through route's proxy (network.proxy); after runs at each sign-in
    (the directory's groups read again)."""
    app = web.Application(middlewares=[errors_middleware], client_max_size=64 * 1024)
    app[KEYS] = catalog
    if settings.issuer:
        app[OIDC] = Provider(settings, route)
        app[SIGNIN] = SignIn(catalog.store, settings, after)
    app.add_routes(
        [
            web.get("/oidc", get_oidc),
            web.post("/oidc", post_oidc),
            web.post("/device", login_device.post_device),
            web.post("/device/token", login_device.post_device_token),
        ]
    )
    return app
