"""/api/v1's status: the cluster at a glance."""

from __future__ import annotations

import time

from aiohttp import web

from llmgw.api_types import ModelCounts, NodeCounts, ReplicaCounts, StatusView
from llmgw.api_types.status import TrafficView
from llmgwd.api.base import ApiContext, api_context, json_response
from llmgwd.api.models import replicas_by_model


async def get_status(request: web.Request) -> web.Response:
    """GET /status: the cluster at a glance."""
    ctx = api_context(request)
    nodes = ctx.nodes.nodes()
    models = ctx.catalog.all()
    by_model = replicas_by_model(nodes)
    ready = sum(r.state == "ready" for m in models for r in by_model.get(m.name, []))
    view = StatusView(
        name=ctx.name,
        version=ctx.version,
        uptime_s=round(time.time() - ctx.started_at, 1),
        join_url=ctx.join_url,
        ca_fingerprint=ctx.ca_fingerprint,
        nodes=NodeCounts(total=len(nodes), connected=sum(n.connected for n in nodes)),
        models=ModelCounts(total=len(models), served=sum(m.replicas > 0 for m in models)),
        replicas=ReplicaCounts(wanted=sum(m.replicas for m in models), ready=ready),
        traffic=_traffic(ctx),
        mode=ctx.mode,
    )
    return json_response(view)


def _traffic(ctx: ApiContext) -> TrafficView | None:
    """This control plane's own /v1 figures over the last minute, from the router's counter."""
    if ctx.traffic is None:
        return None
    rate = ctx.traffic.read()
    return TrafficView(
        scope="this control plane",
        plane=ctx.name,
        window_s=rate.window_s,
        requests_per_s=rate.requests,
        errors_4xx_per_s=rate.c4xx,
        errors_5xx_per_s=rate.c5xx,
    )
