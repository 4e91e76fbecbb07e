"""/api/v1's plans: where a model's replicas are and would go, or why not."""

from __future__ import annotations

from aiohttp import web

from llmgw.api_types import PlaceView, PlanView, ProfilePlan
from llmgwd.api.base import api_context, json_response, scheduling_of
from llmgwd.api.models import _model_or_404, _parked
from llmgwd.placement.estimate import gib
from llmgwd.placement.profiles import DEFAULT


async def get_plan(request: web.Request) -> web.Response:
    """GET /models/{name}/plan: where each replica is and would go, or why not."""
    ctx = api_context(request)
    sched = scheduling_of(ctx)
    model = _model_or_404(ctx, request.match_info["name"])
    placements = [p for p in sched.placements() if p.model == model.name]
    profiles = []
    for profile, verdicts in sched.explain(model):
        mine = [p for p in placements if (p.profile or DEFAULT) == profile.name]
        placed = [
            PlaceView(
                id=p.id,
                node=p.node,
                devices=list(p.devices),
                context=p.context,
                memory=gib(p.memory_bytes) if model.shape is not None else "unknown",
            )
            for p in sorted(mine, key=lambda p: p.id)
        ]
        profiles.append(
            ProfilePlan(
                name=profile.name,
                kind=profile.kind,
                replicas=profile.replicas,
                priority=profile.priority,
                placed=placed,
                verdicts=verdicts,
            )
        )
    view = PlanView(
        model=model.name,
        estimates=model.shape is not None,
        note=model.shape_error,
        parked=_parked(ctx, model),
        profiles=profiles,
        failed_on=sorted(f.node for f in sched.failures() if f.model == model.name),
    )
    return json_response(view)
