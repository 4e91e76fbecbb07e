"""/api/v1's status: the cluster at a glance."""

from __future__ import annotations

import time

from aiohttp import web

from llmgw.api_types import ModelCounts, NodeCounts, ReplicaCounts, StatusView
from llmgwd.api.base import api_context, json_response
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
        nodes=NodeCounts(total=len(nodes), connected=sum(n.connected for n in nodes)),
        models=ModelCounts(total=len(models), served=sum(m.replicas > 0 for m in models)),
        replicas=ReplicaCounts(wanted=sum(m.replicas for m in models), ready=ready),
    )
    return json_response(view)
