"""/api/v1's plans: where a model's replicas are and would go, or why not; and where a model
not yet in the catalog would go (nothing stored, nothing fetched)."""

from __future__ import annotations

import asyncio

import msgspec
from aiohttp import web

from llmgw import sources
from llmgw.api_types import ModelIn, PlaceView, PlanView, ProfilePlan
from llmgw.errors import ApiError
from llmgwd.api.base import (
    ApiContext,
    api_context,
    bad_field,
    json_response,
    read_body,
    scheduling_of,
)
from llmgwd.api.models import _model_or_404, _parked, validate_model
from llmgwd.catalog import Model
from llmgwd.placement.estimate import ModelShape, gib
from llmgwd.placement.model_shape import shape_of_set, shape_of_source
from llmgwd.placement.profiles import DEFAULT


def plan_view(ctx: ApiContext, model: Model) -> PlanView:
    """Where each replica of model is and would go, or why not (GET /models/{name}/plan)."""
    sched = scheduling_of(ctx)
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
                slots=p.slots if model.shape is not None else 0,
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
    return PlanView(
        model=model.name,
        estimates=model.shape is not None,
        note=model.shape_error,
        parked=_parked(ctx, model),
        profiles=profiles,
        failed_on=sorted(f.node for f in sched.failures() if f.model == model.name),
        max_tokens=model.max_tokens,
    )


async def get_plan(request: web.Request) -> web.Response:
    """GET /models/{name}/plan: where each replica is and would go, or why not."""
    ctx = api_context(request)
    return json_response(plan_view(ctx, _model_or_404(ctx, request.match_info["name"])))


async def preview_plan(request: web.Request) -> web.Response:
    """POST /models/plan {as POST /models}: where the model would go were it added, checked as
    POST /models checks it; nothing is stored and nothing is fetched."""
    ctx = api_context(request)
    scheduling_of(ctx)  # a 503 where nothing is placed, as GET /models/{name}/plan's
    model = validate_model(await read_body(request, ModelIn))
    if ctx.catalog.get(model.name) is not None:
        raise ApiError(
            409, f"model {model.name!r} already exists", "conflict_error", "model_exists"
        )
    if sources.is_hf(model.source):
        shape, why = _shape_held(ctx, model.source)
    else:
        shape, why = await asyncio.to_thread(shape_of_source, model.source)
    model = msgspec.structs.replace(model, shape=shape, shape_error=why)
    return json_response(plan_view(ctx, model))


def _shape_held(ctx: ApiContext, source: str) -> tuple[ModelShape | None, str]:
    """An hf: set's shape from what the mirror holds already, or None and why not: a set it
    has not resolved or fetched is placed by count, as it would be once added until fetched."""
    if ctx.mirror is None:  # POST /models' refusal
        raise bad_field("source", "this llmgwd has no mirror: hf: sources cannot be served")
    src = sources.parse_hf(source)
    snap = ctx.mirror.snapshot(src.repo, src.revision)
    if snap is None:
        return None, f"{src.repo}@{src.revision} is not fetched yet: placed by count until it is"
    chosen = set(sources.select([f.path for f in snap.files], src.pattern))
    return shape_of_set(ctx.mirror.store, [f for f in snap.files if f.path in chosen])
