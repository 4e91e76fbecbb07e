"""SCIM's routes, each with its rule (only the SCIM token passes: no API key, no session), and
the application mounted at /scim/v2 on the client port."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from llmgwd.scim import discovery, groups, users
from llmgwd.scim.base import (
    CTX,
    MAX_BODY_BYTES,
    ScimContext,
    answer,
    errors_middleware,
    fail,
    token_auth,
)
from llmgwd.scim.query import listed, params

PREFIX = users.PREFIX
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SCIM_TOKEN = "scim-token"  # noqa: S105 (a rule's name, no secret): the one rule of every route: the SCIM bearer token


async def get_config(request: web.Request) -> web.Response:
    """GET /ServiceProviderConfig"""
    return answer(discovery.config(users.base(request)))


def _listing(docs: list[dict[str, object]]) -> dict[str, object]:
    return {"schemas": ["urn:ietf:params:scim:api:messages:2.0:ListResponse"],
            "totalResults": len(docs), "startIndex": 1, "itemsPerPage": len(docs),
            "Resources": docs}  # fmt: skip


async def get_schemas(request: web.Request) -> web.Response:
    """GET /Schemas"""
    return answer(_listing(discovery.schemas(users.base(request))))


async def get_schema(request: web.Request) -> web.Response:
    """GET /Schemas/{id}"""
    found = [
        s for s in discovery.schemas(users.base(request)) if s["id"] == request.match_info["id"]
    ]
    return answer(found[0]) if found else fail(404, "no such schema")


async def get_resource_types(request: web.Request) -> web.Response:
    """GET /ResourceTypes"""
    return answer(_listing(discovery.resource_types(users.base(request))))


async def get_resource_type(request: web.Request) -> web.Response:
    """GET /ResourceTypes/{id}"""
    types = discovery.resource_types(users.base(request))
    found = [t for t in types if t["id"] == request.match_info["id"]]
    return answer(found[0]) if found else fail(404, "no such resource type")


async def search(request: web.Request) -> web.Response:
    """POST /.search: users and groups alike (RFC 7644 3.4.3)."""
    query_ = await params(request)
    everyone = await users.docs(request) + await groups.docs(request)
    return answer(listed(query_, everyone, users.NAMES + groups.NAMES))


TABLE: list[tuple[str, str, Handler, str]] = [
    ("GET", "/ServiceProviderConfig", get_config, SCIM_TOKEN),
    ("GET", "/Schemas", get_schemas, SCIM_TOKEN),
    ("GET", "/Schemas/{id}", get_schema, SCIM_TOKEN),
    ("GET", "/ResourceTypes", get_resource_types, SCIM_TOKEN),
    ("GET", "/ResourceTypes/{id}", get_resource_type, SCIM_TOKEN),
    ("GET", "/Users", users.list_users, SCIM_TOKEN),
    ("POST", "/Users/.search", users.list_users, SCIM_TOKEN),
    ("POST", "/Users", users.create_user, SCIM_TOKEN),
    ("GET", "/Users/{id}", users.get_user, SCIM_TOKEN),
    ("PUT", "/Users/{id}", users.replace_user, SCIM_TOKEN),
    ("PATCH", "/Users/{id}", users.patch_user, SCIM_TOKEN),
    ("DELETE", "/Users/{id}", users.delete_user, SCIM_TOKEN),
    ("GET", "/Groups", groups.list_groups, SCIM_TOKEN),
    ("POST", "/Groups/.search", groups.list_groups, SCIM_TOKEN),
    ("POST", "/Groups", groups.create_group, SCIM_TOKEN),
    ("GET", "/Groups/{id}", groups.get_group, SCIM_TOKEN),
    ("PUT", "/Groups/{id}", groups.replace_group, SCIM_TOKEN),
    ("PATCH", "/Groups/{id}", groups.patch_group, SCIM_TOKEN),
    ("DELETE", "/Groups/{id}", groups.delete_group, SCIM_TOKEN),
    ("POST", "/.search", search, SCIM_TOKEN),
]


def scim_app(ctx: ScimContext) -> web.Application:
    """The SCIM application, to mount with parent.add_subapp(PREFIX, ...)."""
    app = web.Application(
        middlewares=[errors_middleware, token_auth], client_max_size=MAX_BODY_BYTES
    )
    app[CTX] = ctx
    for method, path, handler, _rule in TABLE:
        app.router.add_route(method, path, handler)
    return app
