"""/api/v1's nodes: as reported, cordoned, drained, uncordoned, and `DELETE /nodes/{name}`
removes a node from the cluster."""

from __future__ import annotations

import logging

import msgspec
from aiohttp import web

from llmgw import pki
from llmgw.api_types import NodeFlagsView, NodeRemoved
from llmgw.errors import ApiError
from llmgwd.api.base import (
    ApiContext,
    NodeInfo,
    api_context,
    bad_field,
    caller,
    json_response,
    not_found,
    scheduling_of,
)
from llmgwd.placement.reconciler import NodeFlags

log = logging.getLogger(__name__)


async def remove_node(request: web.Request) -> web.Response:
    """DELETE /nodes/{name}: revoke the node's certificates (the cluster port refuses them from
    now on), close its connection and place its replicas elsewhere. It comes back only by
    joining again with a token. Any valid name is revoked, known here or not (a node that
    joined before membership records were kept may not be); `known` says which."""
    ctx = api_context(request)
    name = request.match_info["name"]
    if ctx.remove_node is None:
        raise ApiError(503, "nodes cannot be removed here", "server_error", "no_cluster")
    try:
        pki.check_node_name(name)
    except pki.PKIError as e:
        raise bad_field("name", str(e)) from None
    known = await ctx.remove_node(name)
    if known:
        log.warning("node %s removed from the cluster by %s", name, caller(request))
    else:
        log.warning("node name %s revoked by %s (no such node known here)", name, caller(request))
    return json_response(NodeRemoved(name=name, removed=True, known=known))


def _nodes(ctx: ApiContext) -> list[NodeInfo]:
    nodes = sorted(ctx.nodes.nodes(), key=lambda n: n.name)
    if ctx.scheduling is None:
        return nodes
    out = []
    for n in nodes:
        f = ctx.scheduling.flags(n.name)
        out.append(msgspec.structs.replace(n, cordoned=f.cordoned, draining=f.draining))
    return out


async def get_nodes(request: web.Request) -> web.Response:
    """GET /nodes: every node, by name."""
    return json_response(_nodes(api_context(request)))


_NODE_FLAGS = {
    "cordon": NodeFlags(cordoned=True),
    "drain": NodeFlags(cordoned=True, draining=True),
    "uncordon": NodeFlags(),
}


async def set_node_flags(request: web.Request) -> web.Response:
    """POST /nodes/{name}/cordon|drain|uncordon"""
    ctx = api_context(request)
    sched = scheduling_of(ctx)
    name, action = request.match_info["name"], request.match_info["action"]
    known = {n.name for n in ctx.nodes.nodes()} | {p.node for p in sched.placements()}
    if name not in known:
        raise not_found("node", name)
    await sched.set_flags(name, _NODE_FLAGS[action])
    log.info("node %s: %s, by %s", name, action, caller(request))
    f = sched.flags(name)
    return json_response(NodeFlagsView(name=name, cordoned=f.cordoned, draining=f.draining))
