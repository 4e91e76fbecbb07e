"""The console's serve form and model card: what GET /api/v1/models/{name}/plan answers (the
longest context that fits where placement puts a replica, its memory, tokens/s on CPUs) before
the model routes (add, serve, context, replicas, stop, remove) the person may send."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import msgspec
from aiohttp import web

from llmgw.api_types import ModelIn, ModelView, PlanView, ReplicaView
from llmgw.errors import ApiError
from llmgw.reply_time import best
from llmgwd.api.models import validate_model
from llmgwd.console import forms, inproc
from llmgwd.console.base import PREFIX, ConsoleError, Person, console, render, see_other
from llmgwd.console.mirror_page import size
from llmgwd.console.pages import live, read
from llmgwd.console.signin import required
from llmgwd.people.directory import Directory

POLL_S = 5  # the model card's live part (its profiles and replicas)
# The serve form's inputs, as ModelIn (POST /models) names them.
INPUTS = ("name", "source", "engine", "context", "max_tokens", "on_demand")


async def _try_read(request: web.Request, person: Person, plain: str, name: str) -> tuple[int, Any]:
    """GET plain for model name as the person: its status and its answer (None unless 2xx)."""
    c = console(request)
    route = c.routes.get("GET", plain)
    if route is None:
        raise ConsoleError(500, f"/api/v1 has no GET {plain}")
    answer = await inproc.call(request, c.api, person.who, route, {"name": name})
    if answer.status == 403:
        raise ConsoleError(403, answer.message())
    return answer.status, inproc.decoded(answer, route) if answer.ok else None


async def plan_of(request: web.Request, person: Person, name: str) -> tuple[PlanView | None, str]:
    """The model's plan as GET /models/{name}/plan answers the person, or None and why not."""
    c = console(request)
    route = c.routes.get("GET", "/models/{name}/plan")
    if route is None:
        raise ConsoleError(500, "/api/v1 has no GET /models/{name}/plan")
    answer = await inproc.call(request, c.api, person.who, route, {"name": name})
    if answer.ok:
        return inproc.decoded(answer, route), ""
    if answer.status in (403, 404):
        raise ConsoleError(answer.status, answer.message())
    return None, answer.message()


async def new_plan_of(
    request: web.Request, person: Person, body: ModelIn
) -> tuple[PlanView | None, str]:
    """A model not in the catalog's plan as POST /models/plan answers the person (nothing is
    added or fetched), or None and why not."""
    c = console(request)
    route = c.routes.get("POST", "/models/plan")
    if route is None:
        raise ConsoleError(500, "/api/v1 has no POST /models/plan")
    data = msgspec.json.encode(body)
    answer = await inproc.call(request, c.api, person.who, route, {}, body=data)
    if answer.ok:
        return inproc.decoded(answer, route), ""
    if answer.status == 403:
        raise ConsoleError(answer.status, answer.message())
    return None, answer.message()


def asked(query: Mapping[str, str]) -> dict[str, str]:
    """The serve form's inputs as sent (engine llama.cpp and context 0 where not)."""
    values = {k: query.get(k, "").strip() for k in INPUTS}
    values["engine"] = values["engine"] or "llama.cpp"
    for k in ("context", "max_tokens"):
        values[k] = values[k] or "0"
    return values


def checked_model(values: Mapping[str, str]) -> ModelIn:
    """The inputs as POST /models reads them and checks them (validate_model), or the 400 it
    would answer."""
    fields = {k: v for k, v in values.items() if v and (k != "on_demand" or v == "true")}
    try:
        body = msgspec.convert(fields, type=ModelIn, strict=False)
        validate_model(body)
    except msgspec.ValidationError as e:
        raise ConsoleError(400, str(e)) from None
    except ApiError as e:
        raise ConsoleError(e.status, e.detail.message) from None
    return body


async def drawn_for(
    request: web.Request,
    person: Person,
    form_list: Sequence[forms.Form],
    params: Mapping[str, str],
    values: Mapping[str, str] | None = None,
) -> list[forms.Drawn]:
    """The forms of form_list the person may send with these path parameters."""
    c = console(request)
    roles = Directory(c.keys.store)
    return await forms.drawn(person.who, c.routes, form_list, params, roles, values)


async def _preview(request: web.Request, person: Person) -> dict[str, Any]:
    """The serve form's preview: the inputs, the model if the catalog has it, its plan, and
    the form that comes next (add it, or serve it)."""
    values = asked(request.query)
    data: dict[str, Any] = {"values": values, "model": None, "plan": None, "why": ""}
    data |= {"best": [], "add": [], "serve": [], "size": size}
    if not values["name"]:  # a blank form, or one a mirror's set filled the source of
        return data
    body = checked_model(values)
    status, model = await _try_read(request, person, "/models/{name}", body.name)
    if model is None:
        if status != 404:
            raise ConsoleError(status, f"GET /models/{body.name} answered {status}")
        data["add"] = await drawn_for(request, person, (forms.ADD_FORM,), {})
        plan, why = await new_plan_of(request, person, body)
        data |= {"plan": plan, "why": why}
        data["best"] = best(plan, body.max_tokens) if plan is not None else []
        return data
    plan, why = await plan_of(request, person, body.name)
    data |= {"model": model, "plan": plan, "why": why}
    data["best"] = best(plan, model.max_tokens) if plan is not None else []
    values = {"body.replicas": str(max(model.replicas, 1))}
    data["serve"] = await drawn_for(
        request, person, (forms.SERVE_FORM,), {"name": model.name}, values
    )
    return data


async def serve_page(request: web.Request) -> web.Response:
    """GET /console/serve?name=&source=&...: the serve form and, once it names a model, the
    preview (without JS: the Preview button loads this page again with the inputs)."""
    person = required(request)
    data = await _preview(request, person)
    adds = await drawn_for(request, person, (forms.ADD_FORM,), {})
    return render(
        request, "serve.html", person, may_add=bool(adds), refusal="", page="models", **data
    )


async def serve_plan(request: web.Request) -> web.Response:
    """GET /console/serve/plan?...: the preview alone (htmx's), a refusal in its words; a
    browser's own request is sent to the whole page."""
    person = required(request)
    if not live(request):
        return see_other(f"{PREFIX}/serve?{urlencode(list(request.query.items()))}")
    try:
        data = await _preview(request, person)
    except ConsoleError as e:
        if e.status >= 500:
            raise
        return render(request, "serve_plan.html", person, refusal=e.message)
    return render(request, "serve_plan.html", person, refusal="", **data)


def replica_profiles(m: ModelView, plan: PlanView | None) -> dict[str, str]:
    """Each replica's profile, by its id: the plan's placements say, or the model's one
    profile where it has one."""
    owner = {r.id: p.name for p in plan.profiles for r in p.placed} if plan else {}
    if len(m.profiles) == 1:
        owner = {r.id: owner.get(r.id, m.profiles[0].name) for r in m.replica_status}
    return owner


def by_profile(m: ModelView, owner: Mapping[str, str]) -> dict[str, list[ReplicaView]]:
    """The model's replicas by their profile's name."""
    out: dict[str, list[ReplicaView]] = {}
    for r in m.replica_status:
        out.setdefault(owner.get(r.id, ""), []).append(r)
    return out


async def card_forms(request: web.Request, person: Person, m: ModelView) -> dict[str, Any]:
    """The model card's forms the person may send: the model's, one per profile, a new
    profile's."""
    values = forms.model_values(
        m.replicas, m.context, m.price_prompt, m.price_completion, m.max_tokens
    )
    params = {"name": m.name}
    per_profile = {
        p.name: await drawn_for(
            request,
            person,
            (forms.GPU_PROFILE_FORM if p.kind == "gpu" else forms.PROFILE_FORM,),
            params,
            {"body.profile": p.name, "body.replicas": str(p.replicas), "body.gpus": str(p.gpus)},
        )
        for p in m.profiles
    }
    return {
        "drawn": await drawn_for(request, person, forms.MODEL_FORMS, params, values),
        "per_profile": per_profile,
        "new_profile": await drawn_for(request, person, (forms.NEW_PROFILE_FORM,), params),
    }


async def model_card(request: web.Request) -> web.Response:
    """GET /console/models/{name}: the model, its profiles with their replicas and states,
    its plan, and the forms the person may send; htmx polls its live part every POLL_S s."""
    person = required(request)
    name = request.match_info["name"]
    model: ModelView = await read(request, person, "/models/{name}", {"name": name})
    plan, why = await plan_of(request, person, name)
    data: dict[str, Any] = {"m": model, "plan": plan, "why": why, "size": size}
    owner = replica_profiles(model, plan)
    data |= {"owner": owner, "by_profile": by_profile(model, owner), "poll": POLL_S}
    data["best"] = best(plan, model.max_tokens) if plan is not None else []
    if live(request):
        return render(request, "model_live.html", person, page="models", **data)
    data |= await card_forms(request, person, model)
    back = f"/console/models/{name}"
    return render(request, "model.html", person, back=back, page="models", **data)
