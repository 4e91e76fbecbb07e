"""/api/v1's keys: list, create, revoke."""

from __future__ import annotations

import logging

from aiohttp import web

from llmgw.api_types import KeyIn, LimitsIn
from llmgw.api_types import KeyView as KeyView  # re-exported: the answers' types
from llmgw.api_types import NewKey as NewKey
from llmgw.errors import ApiError
from llmgwd.accounting import views
from llmgwd.api.base import (
    ApiContext,
    api_context,
    bad_field,
    caller,
    checked,
    json_response,
    not_found,
    read_body,
)
from llmgwd.catalog import ApiKey, CatalogError, KeyLimits, Role, looks_like_key_id

log = logging.getLogger(__name__)


def key_view(key: ApiKey) -> KeyView:
    """A key as listed: never the key or its hash."""
    return KeyView(
        id=key.id,
        name=key.name,
        prefix=key.prefix,
        role=key.role,
        created_at=key.created_at,
        revoked=key.revoked,
        limits=key.limits,
    )


async def list_keys(request: web.Request) -> web.Response:
    """GET /keys: every key, oldest first, without secrets."""
    keys = api_context(request).catalog.keys()
    return json_response([key_view(k) for k in keys])


def _check_key_in(ctx: ApiContext, body: KeyIn) -> Role:
    name = body.name.strip()
    if not name or len(name) > 64 or not name.isprintable():
        raise bad_field("name", "must be 1-64 printable characters")
    if looks_like_key_id(name):
        raise bad_field("name", "must not look like a key's id (12 hex digits)")
    if body.role not in ("user", "admin"):
        raise bad_field("role", "must be user or admin")
    keys = ctx.catalog.keys()
    if any(k.name == name and not k.revoked for k in keys):
        raise ApiError(409, f"a key named {name!r} exists", "conflict_error", "key_exists")
    return "admin" if body.role == "admin" else "user"


async def create_key(request: web.Request) -> web.Response:
    """POST /keys {name, role?}: a new key, shown this once."""
    ctx = api_context(request)
    body = await read_body(request, KeyIn)
    role = _check_key_in(ctx, body)
    limits = checked(views.apply_limits, KeyLimits(), body.limits or LimitsIn())
    key, secret = await ctx.catalog.create_key(body.name.strip(), role, limits)
    log.info("key %s (%s, %s) created by %s", key.id, key.name, key.role, caller(request))
    new = NewKey(
        id=key.id,
        name=key.name,
        role=key.role,
        prefix=key.prefix,
        created_at=key.created_at,
        limits=key.limits,
        key=secret,
    )
    return json_response(new, 201)


def _find_key(ctx: ApiContext, ident: str) -> ApiKey:
    """The key with this id (revoked or not), else the one active key of this name; several
    active keys of one name are a 409 that lists their ids."""
    keys = ctx.catalog.keys()
    by_id = [k for k in keys if k.id == ident]
    if by_id:
        return by_id[0]  # ids are unique, and no name may look like one
    named = [k for k in keys if k.name == ident and not k.revoked]
    if len(named) > 1:
        ids = ", ".join(k.id for k in named)
        msg = f"{len(named)} active keys are named {ident!r}; give one of their ids: {ids}"
        raise ApiError(409, msg, "conflict_error", "key_ambiguous")
    if not named:
        raise not_found("key", ident)
    return named[0]


async def revoke_key(request: web.Request) -> web.Response:
    """DELETE /keys/{key}: revoke a key by its id, or the one active key of a name."""
    ctx = api_context(request)
    key = _find_key(ctx, request.match_info["key"])
    if not key.revoked:
        try:
            key = await ctx.catalog.revoke_key(key.id)
        except CatalogError:
            raise not_found("key", key.id) from None
        log.info("key %s (%s) revoked by %s", key.id, key.name, caller(request))
    return json_response(key_view(key))
