"""/api/v1's models: the catalog, its replicas, profiles and context."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web

from llmgw import engine_args, sources
from llmgw.api_types import (
    MAX_CONTEXT,
    MAX_REPLICAS,
    SOURCE_RULE,
    ContextIn,
    MaxTokensIn,
    ModelIn,
    ModelRemoved,
    ProfileReplicasIn,
    ServeIn,
)
from llmgw.api_types import ModelView as ModelView  # re-exported: the answers' types
from llmgw.api_types import ReplicaView as ReplicaView
from llmgw.errors import ApiError
from llmgwd.catalog import CatalogError, Model, profiles_of
from llmgwd.placement.model_shape import shape_of_set, shape_of_source
from llmgwd.placement.profiles import Profile, problems

if TYPE_CHECKING:
    from llmgwd.mirror.service import Mirror

from llmgwd.api.base import (
    ApiContext,
    NodeInfo,
    api_context,
    bad_field,
    caller,
    json_response,
    not_found,
    read_body,
)

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
ENGINES = ("llama.cpp", "vllm", "freetoken")


def _check_source(source: str) -> None:
    if sources.is_hf(source):
        try:
            sources.parse_hf(source)
        except sources.SourceError as e:
            raise bad_field("source", str(e)) from None
        return
    path = source.removeprefix("file:")
    if not source.startswith("file:") or not path.startswith("/") or path.startswith("//"):
        raise bad_field("source", SOURCE_RULE)
    if "\0" in path or "\n" in path:
        raise bad_field("source", "the path holds a control character")


def validate_model(body: ModelIn) -> Model:
    """Check a new model's fields (a file's existence is each node's agent's check)."""
    if not NAME_RE.fullmatch(body.name):
        raise bad_field("name", "must be 1-64 of a-z 0-9 . _ - and start with a letter or digit")
    _check_source(body.source)
    if body.engine not in ENGINES:
        raise bad_field("engine", f"must be one of {', '.join(ENGINES)}")
    if body.engine in ("vllm", "freetoken") and not sources.is_hf(body.source):
        raise bad_field(
            "source", f"{body.engine} serves a safetensors set from the mirror: hf:ORG/REPO (a"
            " directory of this host goes in with `llmgw mirror import DIR --as ORG/REPO`)"
        )  # fmt: skip
    try:  # the check each node's agent makes again before it starts an engine
        engine_args.check(body.engine, body.args)
    except engine_args.EngineArgError as e:
        raise bad_field("args", str(e)) from None
    if not 0 <= body.context <= MAX_CONTEXT:
        raise bad_field("context", f"must be between 0 (the engine's default) and {MAX_CONTEXT}")
    if not 0 <= body.max_tokens <= (body.context or MAX_CONTEXT):
        raise bad_field("max_tokens", "must be between 0 (the context) and the context")
    if not 1 <= body.idle_s <= 7 * 86400:
        raise bad_field("idle_s", "must be between 1 and 604800 seconds")
    return Model(
        name=body.name,
        source=body.source,
        engine=body.engine,
        args=body.args,
        context=body.context,
        max_tokens=body.max_tokens,
        on_demand=body.on_demand,
        idle_s=body.idle_s,
        replicas=1 if body.on_demand else 0,  # an on-demand model wakes to one replica
    )


def replicas_by_model(nodes: list[NodeInfo]) -> dict[str, list[ReplicaView]]:
    """Every reported replica, grouped by the model it serves."""
    out: dict[str, list[ReplicaView]] = {}
    for node in nodes:
        for r in node.replicas:
            state, message = (r.state, r.message) if node.connected else ("unknown", "")
            if not node.connected:
                message = f"node {node.name} is not connected"
            view = ReplicaView(
                id=r.id,
                node=node.name,
                state=state,
                message=message,
                restarts=r.restarts,
                slots=r.slots,
                reason=r.reason,
                oom_kills=r.oom_kills,
            )
            out.setdefault(r.model, []).append(view)
    return out


def model_view(model: Model, replicas: list[ReplicaView], parked: bool = False) -> ModelView:
    """The API's view of a model and its replicas."""
    up = model.upstream  # an external provider's model: its API for an engine, no profile
    return ModelView(
        name=model.name,
        source=model.source,
        engine=up.protocol if up is not None else model.engine,
        args=model.args,
        context=model.context,
        max_tokens=model.max_tokens,
        price_prompt=model.price_prompt,
        price_completion=model.price_completion,
        replicas=model.replicas,
        ready=sum(r.state == "ready" for r in replicas),
        created_at=model.created_at,
        replica_status=sorted(replicas, key=lambda r: r.id),
        profiles=profiles_of(model) if up is None else [],
        on_demand=model.on_demand,
        idle_s=model.idle_s if model.on_demand else 0,
        parked=parked,
        shape_note=model.shape_error,
        files=len(model.files),
        bytes=sum(f.size for f in model.files),
    )


def _model_or_404(ctx: ApiContext, name: str) -> Model:
    model = ctx.catalog.get(name)
    if model is None:
        raise not_found("model", name)
    return model


def _not_external(model: Model | None) -> None:
    """A provider's model runs upstream: it has no replicas to serve."""
    if model is not None and model.upstream is not None:
        raise bad_field("replicas", f"model {model.name} is served by its external provider")


def _parked(ctx: ApiContext, model: Model) -> bool:
    return ctx.scheduling is not None and not ctx.scheduling.awake(model)


def _rollout(ctx: ApiContext, model: Model) -> str:
    return ctx.scheduling.rollout(model) if ctx.scheduling is not None else ""


def _view(ctx: ApiContext, model: Model) -> ModelView:
    replicas = replicas_by_model(ctx.nodes.nodes()).get(model.name, [])
    view = model_view(model, replicas, _parked(ctx, model))
    view.rollout = _rollout(ctx, model)
    if ctx.mirror is not None and sources.is_hf(model.source):
        view.mirror = ctx.mirror.set_status(model.source)
    return view


async def list_models(request: web.Request) -> web.Response:
    """GET /models: the catalog with each model's replicas."""
    ctx = api_context(request)
    by_model = replicas_by_model(ctx.nodes.nodes())
    views = []
    for m in ctx.catalog.all():
        view = model_view(m, by_model.get(m.name, []), _parked(ctx, m))
        view.rollout = _rollout(ctx, m)
        views.append(view)
    return json_response(views)


async def get_model(request: web.Request) -> web.Response:
    """GET /models/{name}"""
    ctx = api_context(request)
    return json_response(_view(ctx, _model_or_404(ctx, request.match_info["name"])))


async def add_model(request: web.Request) -> web.Response:
    """POST /models: put a new model in the catalog (not served until /serve)."""
    ctx = api_context(request)
    model = validate_model(await read_body(request, ModelIn))
    if ctx.catalog.get(model.name) is not None:
        raise ApiError(
            409, f"model {model.name!r} already exists", "conflict_error", "model_exists"
        )
    if sources.is_hf(model.source):
        return await _add_hf(request, ctx, model)
    shape, why = await asyncio.to_thread(shape_of_source, model.source)
    model = msgspec.structs.replace(model, shape=shape, shape_error=why)
    if why:
        log.warning("model %s: %s", model.name, why)
    try:
        model = await ctx.catalog.add_model(model)
    except CatalogError as e:
        raise ApiError(409, str(e), "conflict_error", "model_exists") from None
    log.info("model %s added (%s) by %s", model.name, model.source, caller(request))
    return json_response(_view(ctx, model), 201)


async def _add_hf(request: web.Request, ctx: ApiContext, model: Model) -> web.Response:
    """An hf: model: the mirror pins it and starts fetching its set; its shape is read from
    the mirror's copy once fetched (model_shape.shape_of_set)."""
    from llmgwd.mirror.service import MirrorError

    if ctx.mirror is None:
        raise bad_field("source", "this llmgwd has no mirror: hf: sources cannot be served")
    src = sources.parse_hf(model.source)
    try:
        if model.engine == "vllm":  # refused before anything is fetched
            src = src.pinned(await _safetensors_commit(ctx.mirror, src))
        pinned, files = await ctx.mirror.add(src)
    except MirrorError as e:
        raise ApiError(
            e.status, str(e), "invalid_request_error", "mirror_failed", "source"
        ) from None
    shape, why = await asyncio.to_thread(shape_of_set, ctx.mirror.store, files)
    model = msgspec.structs.replace(
        model, source=str(pinned), files=files, shape=shape, shape_error=why
    )
    try:
        model = await ctx.catalog.add_model(model)
    except CatalogError as e:
        raise ApiError(409, str(e), "conflict_error", "model_exists") from None
    log.info(
        "model %s added (%s, %d files) by %s", model.name, model.source, len(files), caller(request)
    )
    return json_response(_view(ctx, model), 201)


async def _safetensors_commit(mirror: Mirror, src: sources.HfSource) -> str:
    """The commit src names, or a 400 when its set holds no safetensors weights with a
    config.json (what vLLM serves)."""
    snap = await mirror.resolve(src)
    chosen = sources.select([f.path for f in snap.files], src.pattern)
    if "config.json" not in chosen or not any(p.endswith(".safetensors") for p in chosen):
        raise bad_field(
            "source", f"{src.repo}@{snap.commit[:12]}: vllm serves safetensors weights with"
            " their config.json, and this set holds none (a GGUF set runs on llama.cpp)"
        )  # fmt: skip
    return snap.commit


async def _update(ctx: ApiContext, name: str, **changes: object) -> Model:
    try:
        return await ctx.catalog.update_model(name, **changes)
    except CatalogError:
        raise not_found("model", name) from None  # removed meanwhile


async def _set_replicas(request: web.Request, replicas: int) -> web.Response:
    ctx = api_context(request)
    name = request.match_info["name"]
    model = _model_or_404(ctx, name)
    changes: dict[str, object] = {"replicas": replicas}
    if len(model.profiles) > 1 and replicas:
        raise bad_field(
            "replicas", f"model {name} has several profiles: use `llmgw model replicas --profile`"
        )
    if model.profiles:
        changes["profiles"] = [
            msgspec.structs.replace(p, replicas=replicas) for p in model.profiles
        ]
    model = await _update(ctx, name, **changes)
    log.info("model %s: %d replicas wanted, by %s", name, replicas, caller(request))
    return json_response(_view(ctx, model))


def with_profile_replicas(model: Model, body: ProfileReplicasIn) -> list[Profile]:
    """The model's profiles with one profile's count set (a new one made, a cpu or gpu)."""
    profiles = profiles_of(model)
    names = [p.name for p in profiles]
    if body.profile in names:
        i = names.index(body.profile)
        old = profiles[i]
        if body.gpus is not None and old.kind != "gpu":
            raise bad_field("gpus", f"profile {old.name!r} runs on CPUs: it has no cards")
        priority = old.priority if body.priority is None else body.priority
        gpus = old.gpus if body.gpus is None else body.gpus
        profiles[i] = msgspec.structs.replace(
            old, replicas=body.replicas, priority=priority, gpus=gpus
        )
        return profiles
    kind = body.kind or ("gpu" if body.profile.startswith("gpu") else "cpu")
    if kind not in ("cpu", "gpu"):
        raise bad_field("kind", "must be cpu or gpu")
    if body.gpus is not None and kind != "gpu":
        raise bad_field("gpus", "a cpu profile has no cards")
    new = Profile(
        name=body.profile,
        kind="gpu" if kind == "gpu" else "cpu",
        engine=model.engine,
        args=list(model.args),
        replicas=body.replicas,
        priority=body.priority or 0,
        gpus=body.gpus or 1,
        cores=0 if kind == "gpu" else 1,
    )
    return [*profiles, new]


async def set_profile_replicas(request: web.Request) -> web.Response:
    """POST /models/{name}/replicas {profile, replicas, kind?, priority?, gpus?}"""
    ctx = api_context(request)
    name = request.match_info["name"]
    model = _model_or_404(ctx, name)
    _not_external(model)
    body = await read_body(request, ProfileReplicasIn)
    if not NAME_RE.fullmatch(body.profile):
        raise bad_field("profile", "must be 1-64 of a-z 0-9 . _ - and start with a letter or digit")
    if not 0 <= body.replicas <= MAX_REPLICAS:
        raise bad_field("replicas", f"must be between 0 and {MAX_REPLICAS}")
    profiles = with_profile_replicas(model, body)
    wrong = problems(profiles)
    if wrong:
        raise bad_field("profile", "; ".join(wrong))
    total = sum(p.replicas for p in profiles)
    model = await _update(ctx, name, profiles=profiles, replicas=total)
    log.info(
        "model %s: profile %s wants %d replicas, by %s",
        name,
        body.profile,
        body.replicas,
        caller(request),
    )
    return json_response(_view(ctx, model))


async def set_context(request: web.Request) -> web.Response:
    """PUT /models/{name}/context {context, max_tokens?}: tokens (0: as the model was
    trained), and with it the longest answer, set together; the reconciler replaces the
    replicas one at a time to take the context (placement/rolling.py)."""
    ctx = api_context(request)
    name = request.match_info["name"]
    model = _model_or_404(ctx, name)
    body = await read_body(request, ContextIn)
    if not 0 <= body.context <= MAX_CONTEXT:
        raise bad_field("context", f"must be between 0 and {MAX_CONTEXT}")
    longest = model.max_tokens if body.max_tokens is None else body.max_tokens
    if body.max_tokens is None and longest and body.context and longest > body.context:
        raise bad_field("context", f"is below the model's max_tokens ({longest})")
    _check_max_tokens(longest, body.context)
    model = await _update(ctx, name, context=body.context, max_tokens=longest)
    log.info("model %s: context %d, by %s", name, body.context, caller(request))
    return json_response(_view(ctx, model))


def _check_max_tokens(max_tokens: int, context: int) -> None:
    """The longest answer a request may ask for: 0 (the context) up to the context."""
    if not 0 <= max_tokens <= (context or MAX_CONTEXT):
        raise bad_field("max_tokens", "must be between 0 (the context) and the model's context")


async def set_max_tokens(request: web.Request) -> web.Response:
    """PUT /models/{name}/max_tokens {max_tokens}: the longest answer a request may ask for
    (0: the context); the router reads it per request, so no replica is started again."""
    ctx = api_context(request)
    name = request.match_info["name"]
    model = _model_or_404(ctx, name)
    body = await read_body(request, MaxTokensIn)
    _check_max_tokens(body.max_tokens, model.context)
    model = await _update(ctx, name, max_tokens=body.max_tokens)
    log.info("model %s: max_tokens %d, by %s", name, body.max_tokens, caller(request))
    return json_response(_view(ctx, model))


async def restart_model(request: web.Request) -> web.Response:
    """POST /models/{name}/restart: every replica started again, one at a time (a new
    generation, which the reconciler rolls to as it does a new context: rolling.py)."""
    ctx = api_context(request)
    name = request.match_info["name"]
    model = _model_or_404(ctx, name)
    model = await _update(ctx, name, generation=model.generation + 1)
    log.info("model %s: restarted (generation %d), by %s", name, model.generation, caller(request))
    return json_response(_view(ctx, model))


async def serve_model(request: web.Request) -> web.Response:
    """POST /models/{name}/serve {replicas}: how many replicas to run."""
    body = await read_body(request, ServeIn)
    if not 0 <= body.replicas <= MAX_REPLICAS:
        raise bad_field("replicas", f"must be between 0 and {MAX_REPLICAS}")
    ctx = api_context(request)
    model = ctx.catalog.get(request.match_info["name"])
    _not_external(model)
    if ctx.mirror is not None and model is not None and model.files and body.replicas:
        ctx.mirror.fetch(model.source, list(model.files))  # a set that failed: try again now
    return await _set_replicas(request, body.replicas)


async def stop_model(request: web.Request) -> web.Response:
    """POST /models/{name}/stop: no replicas (the model stays in the catalog)."""
    return await _set_replicas(request, 0)


async def remove_model(request: web.Request) -> web.Response:
    """DELETE /models/{name}[?files=true]: out of the catalog (its replicas are stopped); with
    files, its files no other model uses are deleted from the mirror and the nodes."""
    from llmgwd.api import mirror as api_mirror

    ctx = api_context(request)
    name = request.match_info["name"]
    files = request.query.get("files", "false")
    if files not in ("true", "false"):
        raise bad_field("files", "must be true or false")
    model = _model_or_404(ctx, name)
    try:
        await ctx.catalog.remove_model(name)
    except CatalogError:
        raise not_found("model", name) from None
    log.info("model %s removed by %s", name, caller(request))
    if files == "true" and model.files:
        swept = await api_mirror.remove_files_of(ctx, model)
        return json_response(ModelRemoved(name=name, removed=True, files=swept))
    return json_response(ModelRemoved(name=name, removed=True))
