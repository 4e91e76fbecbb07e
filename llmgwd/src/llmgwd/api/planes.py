"""/api/v1's control planes: list them, make a token for a new one, take one out."""

from __future__ import annotations

import logging
import shlex

from aiohttp import web

from llmgw.api_types import PlaneRemoved, PlaneTokenIn, RemoveIn, TokenView
from llmgw.errors import ApiError
from llmgwd.api.base import api_context, bad_field, caller, json_response, read_body
from llmgwd.planes import listing, tokens
from llmgwd.planes.listing import ControlPlanes

log = logging.getLogger(__name__)


def _planes(request: web.Request) -> ControlPlanes:
    planes = api_context(request).control_planes
    if planes is None:
        raise ApiError(503, "this llmgwd keeps no control planes", "server_error", "no_planes")
    return planes


def _etcd(planes: ControlPlanes) -> listing.EtcdCluster:
    if planes.etcd is None:
        raise ApiError(
            409,
            "this cluster's store is SQLite, one control plane: run "
            "`llmgw plane migrate --to etcd` first",
            "conflict_error",
            "no_etcd",
        )
    return planes.etcd


async def list_planes(request: web.Request) -> web.Response:
    """GET /planes: every control plane, its etcd member's health, and who leads."""
    planes = _planes(request)
    return json_response(await listing.view(planes.store, planes.etcd, planes.me))


async def create_plane_token(request: web.Request) -> web.Response:
    """POST /planes/tokens {ttl_s?}: a one-time token a new control plane joins with."""
    planes = _planes(request)
    body = await read_body(request, PlaneTokenIn)
    if not 60 <= body.ttl_s <= tokens.MAX_TTL_S:
        raise bad_field("ttl_s", f"must be 60 to {tokens.MAX_TTL_S} seconds")
    _etcd(planes)
    token = await planes.tokens.mint(body.ttl_s)
    log.info("plane token made by %s", caller(request))
    url = planes.join_url
    command = f"llmgw plane join {shlex.quote(url)} --token {shlex.quote(token)}"
    return json_response(
        TokenView(token=token, expires_in=body.ttl_s, url=url, command=command), 201
    )


async def _remove(request: web.Request, name: str, leaving: bool) -> web.Response:
    planes = _planes(request)
    body = await read_body(request, RemoveIn)
    etcd = _etcd(planes)
    try:
        gone = await listing.remove(etcd, name, me=planes.me, force=body.force, leaving=leaving)
    except listing.NoSuchPlane as e:
        raise ApiError(404, str(e), "not_found_error", "plane_not_found") from None
    except listing.Refusal as e:
        raise ApiError(409, str(e), "conflict_error", "quorum") from None
    await planes.store.delete(listing.SERVERS + name)
    verb = "left" if leaving else "removed by " + caller(request)
    log.warning("control plane %s %s (etcd member %x)", name, verb, gone.id)
    return json_response(PlaneRemoved(name=name, member=format(gone.id, "x"), removed=True))


async def leave(request: web.Request) -> web.Response:
    """POST /planes/leave {force?}: this control plane's etcd member leaves the cluster."""
    return await _remove(request, _planes(request).me, True)


async def remove_plane(request: web.Request) -> web.Response:
    """DELETE /planes/{name} {force?}: a dead control plane's member taken out."""
    return await _remove(request, request.match_info["name"], False)
