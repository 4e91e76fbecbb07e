"""/api/v1's node membership: `DELETE /nodes/{name}` removes a node from the cluster."""

from __future__ import annotations

import logging

from aiohttp import web

from llmgw import pki
from llmgwd.api import ApiError, _ctx, _who, bad_field, json_response

log = logging.getLogger(__name__)


async def remove_node(request: web.Request) -> web.Response:
    """DELETE /nodes/{name}: revoke the node's certificates (the cluster port refuses them from
    now on), close its connection and place its replicas elsewhere. It comes back only by
    joining again with a token. Any valid name is revoked, known here or not (a node that
    joined before membership records were kept may not be); `known` says which."""
    ctx = _ctx(request)
    name = request.match_info["name"]
    if ctx.remove_node is None:
        raise ApiError(503, "nodes cannot be removed here", "server_error", "no_cluster")
    try:
        pki.check_node_name(name)
    except pki.PKIError as e:
        raise bad_field("name", str(e)) from None
    known = await ctx.remove_node(name)
    if known:
        log.warning("node %s removed from the cluster by %s", name, _who(request))
    else:
        log.warning("node name %s revoked by %s (no such node known here)", name, _who(request))
    return json_response({"name": name, "removed": True, "known": known})


def routes() -> list[web.RouteDef]:
    """This module's routes, relative to /api/v1."""
    return [web.delete("/nodes/{name}", remove_node)]
