"""llmgwd's admin API /api/v1 (models, nodes, keys, join tokens, limits, prices, usage) and its
two ways of auth."""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, NoReturn, Protocol, TypeVar

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler, Middleware

from llmgw import engine_args, sources, wire
from llmgw.localsock import allowed, peer_credentials
from llmgw.mirror_api import SetStatus
from llmgwd import engine_support, meter_views
from llmgwd.catalog import (
    ApiKey,
    Catalog,
    CatalogError,
    KeyLimits,
    Model,
    Role,
    looks_like_key_id,
    profiles_of,
)
from llmgwd.estimate import gib
from llmgwd.meter_views import Invalid, LimitsIn, PriceIn
from llmgwd.profiles import DEFAULT, Profile, problems
from llmgwd.reconciler import Failure, NodeFlags
from llmgwd.scheduler import Placement, Verdict
from llmgwd.shapes import read_shape
from llmgwd.store import StoreUnavailable
from llmgwd.usage import Usage

if TYPE_CHECKING:
    from llmgwd.control_planes import ControlPlanes
    from llmgwd.mirror.service import Mirror
    from llmgwd.mirror.sweep import NodeFiles
    from llmgwd.slurm.lending import NodeStatus
    from llmgwd.slurm.settings import SettingsStore

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
PRINCIPAL = web.RequestKey("llmgw.principal", str)  # who calls, for the log (never a secret)
MAX_REPLICAS = 1024
MAX_CONTEXT = 1 << 24
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
ENGINES = ("llama.cpp", "vllm")


def _own_version() -> str:
    try:
        return version("llmgwd")
    except PackageNotFoundError:
        return "0+unknown"


# What the API needs from the rest of the daemon.


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One node as the cluster state knows it (the /api/v1/nodes item)."""

    name: str
    address: str
    connected: bool
    last_seen: float  # unix time of its last message
    cores: int
    memory_bytes: int
    replicas: list[wire.ReplicaStatus] = []
    version: str = ""  # the agent's
    cordoned: bool = False  # takes no new replicas
    draining: bool = False  # its replicas are being moved off
    gpus: int = 0  # its cards
    cuda_toolkit: str = ""  # nvcc's version ("12.4"); "": none (llama.cpp on CPUs only)
    engines: list[str] = []  # "llama.cpp:cpu", "vllm:gpu", ...: what it runs where
    note: str = ""  # what people should know of it (engine_support.node_note)
    firewall: str = ""  # its nftables table: "ok", or why not set (Inventory.firewall)


class NodesView(Protocol):
    """The cluster state's nodes, as last reported."""

    def nodes(self) -> list[NodeInfo]:
        """Every known node (connected or not)."""
        ...


class ClusterNode(Protocol):
    """The fields of a node the cluster state keeps that the API shows."""

    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def inventory(self) -> wire.Inventory: ...
    @property
    def replicas(self) -> Sequence[wire.ReplicaStatus]: ...
    @property
    def connected(self) -> bool: ...
    @property
    def last_seen(self) -> float: ...


@dataclass(frozen=True, slots=True)
class ClusterNodes:
    """A NodesView over the cluster state's own node records (ClusterState.nodes)."""

    source: Callable[[], Sequence[ClusterNode]]

    def nodes(self) -> list[NodeInfo]:
        """Every node the cluster state knows, as the API shows it."""
        return [
            NodeInfo(
                name=n.name,
                address=n.address,
                connected=n.connected,
                last_seen=n.last_seen,
                cores=n.inventory.cores,
                memory_bytes=n.inventory.memory_bytes,
                replicas=list(n.replicas),
                version=n.version,
                gpus=len(n.inventory.gpus),
                cuda_toolkit=n.inventory.cuda_toolkit,
                engines=list(n.inventory.engines),
                note=engine_support.node_note(n.inventory),
                firewall=n.inventory.firewall,
            )
            for n in self.source()
        ]


class Scheduling(Protocol):
    """What the API asks of the reconciler (placements, node flags, plans, on-demand state)."""

    def awake(self, model: Model) -> bool:
        """Whether the model's replicas are wanted now (False: an on-demand model parked)."""
        ...

    def flags(self, node: str) -> NodeFlags:
        """What an admin said of node."""
        ...

    async def set_flags(self, node: str, flags: NodeFlags) -> None:
        """Cordon, drain or uncordon a node."""
        ...

    def placements(self) -> list[Placement]:
        """Where every replica is."""
        ...

    def failures(self) -> list[Failure]:
        """Where models failed to start."""
        ...

    def explain(self, model: Model) -> list[tuple[Profile, list[Verdict]]]:
        """Per profile, where one more replica would go or why not."""
        ...


class KeyLookup(Protocol):
    """What key_auth needs: the catalog's key check."""

    def authenticate(self, secret: str) -> ApiKey | None:
        """The live key matching secret, or None."""
        ...


@dataclass(slots=True)
class ApiContext:
    """Everything the API handlers use, supplied by the daemon."""

    catalog: Catalog
    nodes: NodesView
    mint_token: Callable[[], str]  # a new join token (carries the CA's fingerprint)
    join_url: str  # the cluster port's advertised URL, https://HOST:7710
    token_ttl_s: float = 3600.0
    name: str = "llmgw"
    version: str = field(default_factory=_own_version)
    started_at: float = field(default_factory=time.time)
    usage: Usage = field(default_factory=lambda: Usage(None))  # the router's counts
    scheduling: Scheduling | None = None  # the reconciler; None: nothing is placed here
    # `llmgw node remove`: revoke a node's certificates and forget it; whether it was known
    # (a name not known here is revoked all the same).
    remove_node: Callable[[str], Awaitable[bool]] | None = None
    mirror: Mirror | None = None  # None: hf: sources are refused here
    node_files: NodeFiles | None = None  # the nodes' caches, for sweeps
    control_planes: ControlPlanes | None = None  # /servers: None, this llmgwd keeps none
    slurm: SettingsStore | None = None  # /slurm: None, Slurm's settings are not kept here
    # Each node's standing between llmgw and Slurm (Roles.slurm_status; None: a standby's)
    slurm_status: Callable[[], list[NodeStatus] | None] | None = None


CTX = web.AppKey("llmgw.api", ApiContext)


# Errors: {"error": {"message", "type", "code"}}, as OpenAI's API shapes them.


class ErrorBody(msgspec.Struct, omit_defaults=True):
    """The body of an error answer."""

    message: str
    type: str
    code: str
    param: str | None = None  # the request field at fault, for a 400


class ErrorAnswer(msgspec.Struct):
    """An error answer."""

    error: ErrorBody


class ApiError(Exception):
    """An error answer a handler raises; the message is shown to the caller."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        code: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(message=message, type=type_, code=code, param=param)
        self.headers = headers or {}


def bad_field(param: str, message: str) -> ApiError:
    """A 400 that names the field at fault."""
    return ApiError(400, f"{param}: {message}", "invalid_request_error", "invalid_field", param)


def not_found(what: str, ident: str) -> ApiError:
    """A 404 for an unknown model or key."""
    return ApiError(404, f"no {what} {ident!r}", "not_found_error", f"{what}_not_found")


_encoder = msgspec.json.Encoder()


def json_response(data: object, status: int = 200) -> web.Response:
    """A JSON answer of any msgspec-encodable value."""
    return web.Response(body=_encoder.encode(data), status=status, content_type="application/json")


def error_response(err: ApiError) -> web.Response:
    """The JSON answer of an ApiError."""
    resp = json_response(ErrorAnswer(err.body), err.status)
    resp.headers.update(err.headers)
    return resp


_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as a JSON error, never as HTML or a traceback."""
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        type_ = _HTTP_TYPES.get(e.status, "invalid_request_error")
        code = e.reason.lower().replace(" ", "_")
        return error_response(ApiError(e.status, e.reason, type_, code))
    except StoreUnavailable as e:
        log.warning("%s %s: the store is unavailable (%s)", request.method, request.path, e)
        return error_response(_store_unavailable())
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return error_response(ApiError(500, "internal error", "server_error", "internal_error"))


def _store_unavailable() -> ApiError:
    """503 for a request the store could not take now (etcd without quorum or changing
    leader): say so, rather than a bare 500, so the caller knows to ask again."""
    return ApiError(
        503,
        "the cluster's store cannot answer now (its quorum is lost or its leader changing); "
        "a change may not have been made: check, then ask again in a few seconds",
        "server_error",
        "store_unavailable",
        headers={"Retry-After": "2"},
    )


# Request bodies.

T = TypeVar("T")
# The largest body: read_body counts it itself, since a sub-app's client_max_size is not
# applied (the client port's application reads with its own, /v1's 4 MB).
MAX_BODY_BYTES = 64 * 1024


class ModelIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /api/v1/models"""

    name: str
    source: str
    engine: str
    args: list[str] = []
    context: int = 0
    max_tokens: int = 0
    on_demand: bool = False  # started by the first request, parked after idle_s without one
    idle_s: int = 300


class ServeIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST /api/v1/models/{name}/serve"""

    replicas: int


class ProfileReplicasIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /api/v1/models/{name}/replicas: a profile's count (a new profile is made)."""

    profile: str
    replicas: int
    kind: str = ""  # for a new profile: cpu or gpu ("": gpu if its name starts so, else cpu)
    priority: int | None = None


class ContextIn(msgspec.Struct, forbid_unknown_fields=True):
    """PUT /api/v1/models/{name}/context"""

    context: int


class KeyIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /api/v1/keys"""

    name: str
    role: str = "user"
    limits: LimitsIn | None = None


_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_MISSING = re.compile(r"Object missing required field `(?P<f>[^`]+)`")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<f>[^`]+)`")


def _validation_error(message: str) -> ApiError:
    """msgspec's '... - at `$.field`' as a 400 that names the field."""
    for pattern, why in ((_MISSING, "is required"), (_UNKNOWN, "is not a known field")):
        m = pattern.match(message)
        if m:
            return bad_field(m.group("f"), why)
    at = _AT.search(message)
    if at is None:
        return ApiError(400, f"body: {message}", "invalid_request_error", "invalid_body", "body")
    param = re.sub(r"\[\d+\]$", "", at.group("path")) or "body"
    return bad_field(param, message[: at.start()])


async def read_body(request: web.Request, schema: type[T], limit: int = MAX_BODY_BYTES) -> T:
    """Decode the JSON body into schema, or raise a 400 naming the field."""
    raw = await _read_limited(request, limit)
    try:
        return msgspec.json.decode(raw or b"{}", type=schema)
    except msgspec.ValidationError as e:
        raise _validation_error(str(e)) from None
    except msgspec.DecodeError:
        raise ApiError(
            400, "body: not valid JSON", "invalid_request_error", "invalid_json", "body"
        ) from None


async def _read_limited(request: web.Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it passes limit (declared, or counted)."""
    if request.content_length is not None and request.content_length > limit:
        raise _body_error(413, f"larger than {limit} bytes", "request_too_large")
    body = bytearray()
    try:
        while chunk := await request.content.readany():
            body += chunk
            if len(body) > limit:
                raise _body_error(413, f"larger than {limit} bytes", "request_too_large")
    except HttpProcessingError as e:  # a stalled upload (408), a broken chunked encoding
        if e.code == 408:
            raise _body_error(408, "the upload stalled", "timeout") from None
        raise _body_error(400, "could not be read", "invalid_body") from None
    except ConnectionError:
        raise _body_error(400, "the client left before it was sent", "client_closed") from None
    return bytes(body)


def _body_error(status: int, why: str, code: str) -> ApiError:
    return ApiError(status, f"body: {why}", "invalid_request_error", code, "body")


def _check_source(source: str) -> None:
    if sources.is_hf(source):
        try:
            sources.parse_hf(source)
        except sources.SourceError as e:
            raise bad_field("source", str(e)) from None
        return
    path = source.removeprefix("file:")
    if not source.startswith("file:") or not path.startswith("/") or path.startswith("//"):
        raise bad_field(
            "source", "must be hf:ORG/REPO[@REV][:PATTERN] or file:/absolute/path (on the nodes)"
        )
    if "\0" in path or "\n" in path:
        raise bad_field("source", "the path holds a control character")


def validate_model(body: ModelIn) -> Model:
    """Check a new model's fields (a file's existence is each node's agent's check)."""
    if not NAME_RE.fullmatch(body.name):
        raise bad_field("name", "must be 1-64 of a-z 0-9 . _ - and start with a letter or digit")
    _check_source(body.source)
    if body.engine not in ENGINES:
        raise bad_field("engine", f"must be one of {', '.join(ENGINES)}")
    if body.engine == "vllm" and not sources.is_hf(body.source):
        raise bad_field(
            "source", "vllm serves a safetensors set from the mirror: hf:ORG/REPO (a directory"
            " of this host goes in with `llmgw mirror import DIR --as ORG/REPO`)"
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
        engine="vllm" if body.engine == "vllm" else "llama.cpp",
        args=body.args,
        context=body.context,
        max_tokens=body.max_tokens,
        on_demand=body.on_demand,
        idle_s=body.idle_s,
        replicas=1 if body.on_demand else 0,  # an on-demand model wakes to one replica
    )


# Answers.


class ReplicaView(msgspec.Struct, kw_only=True):
    """One replica of a model, as its node reports it."""

    id: str
    node: str
    state: str  # wire.ReplicaState, or "unknown" while its node is not connected
    message: str = ""
    restarts: int = 0  # how often its agent started it again after it died
    slots: int = 0  # requests its engine serves at once, the router's cap (0: not known)
    reason: str = ""  # why it last ended unasked: "oom" (over its memory limit), "exit"
    oom_kills: int = 0  # how often the kernel ended it over its memory limit


class ModelView(msgspec.Struct, kw_only=True):
    """A model of the catalog with what runs of it."""

    name: str
    source: str
    engine: str
    args: list[str]
    context: int
    max_tokens: int
    price_prompt: float  # per million tokens
    price_completion: float
    replicas: int  # wanted (an on-demand model: while awake)
    ready: int
    created_at: float
    replica_status: list[ReplicaView]
    profiles: list[Profile] = []  # the model's, or the one default profile
    on_demand: bool = False
    idle_s: int = 0
    parked: bool = False  # an on-demand model with no request for idle_s: no replica wanted
    shape_note: str = ""  # why estimates are missing ("": the file's shape is known)
    files: int = 0  # an hf: source's set: how many files, and their bytes
    bytes: int = 0
    mirror: SetStatus | None = None  # the mirror's fetch of the set, while it runs (or failed)


class KeyView(msgspec.Struct, kw_only=True):
    """A key without its secret or hash."""

    id: str
    name: str
    prefix: str
    role: str
    created_at: float
    revoked: bool
    limits: KeyLimits


class NewKey(msgspec.Struct, kw_only=True):
    """A key just made: the only answer that holds the key itself."""

    id: str
    name: str
    role: str
    prefix: str
    created_at: float
    limits: KeyLimits
    key: str


class TokenView(msgspec.Struct, kw_only=True):
    """A new join token and the command that uses it."""

    token: str
    expires_in: int
    url: str
    command: str


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
    return ModelView(
        name=model.name,
        source=model.source,
        engine=model.engine,
        args=model.args,
        context=model.context,
        max_tokens=model.max_tokens,
        price_prompt=model.price_prompt,
        price_completion=model.price_completion,
        replicas=model.replicas,
        ready=sum(r.state == "ready" for r in replicas),
        created_at=model.created_at,
        replica_status=sorted(replicas, key=lambda r: r.id),
        profiles=profiles_of(model),
        on_demand=model.on_demand,
        idle_s=model.idle_s if model.on_demand else 0,
        parked=parked,
        shape_note=model.shape_error,
        files=len(model.files),
        bytes=sum(f.size for f in model.files),
    )


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


# Handlers.


def _ctx(request: web.Request) -> ApiContext:
    return request.config_dict[CTX]


def _who(request: web.Request) -> str:
    return str(request.get(PRINCIPAL, "?"))


async def get_status(request: web.Request) -> web.Response:
    """GET /status: the cluster at a glance."""
    ctx = _ctx(request)
    nodes = ctx.nodes.nodes()
    models = ctx.catalog.all()
    by_model = replicas_by_model(nodes)
    ready = sum(r.state == "ready" for m in models for r in by_model.get(m.name, []))
    return json_response(
        {
            "name": ctx.name,
            "version": ctx.version,
            "uptime_s": round(time.time() - ctx.started_at, 1),
            "join_url": ctx.join_url,
            "nodes": {"total": len(nodes), "connected": sum(n.connected for n in nodes)},
            "models": {"total": len(models), "served": sum(m.replicas > 0 for m in models)},
            "replicas": {"wanted": sum(m.replicas for m in models), "ready": ready},
        }
    )


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
    return json_response(_nodes(_ctx(request)))


def _scheduling(ctx: ApiContext) -> Scheduling:
    if ctx.scheduling is None:
        raise ApiError(503, "no scheduler runs here", "server_error", "no_scheduler")
    return ctx.scheduling


_NODE_FLAGS = {
    "cordon": NodeFlags(cordoned=True),
    "drain": NodeFlags(cordoned=True, draining=True),
    "uncordon": NodeFlags(),
}


async def set_node_flags(request: web.Request) -> web.Response:
    """POST /nodes/{name}/cordon|drain|uncordon"""
    ctx = _ctx(request)
    sched = _scheduling(ctx)
    name, action = request.match_info["name"], request.match_info["action"]
    known = {n.name for n in ctx.nodes.nodes()} | {p.node for p in sched.placements()}
    if name not in known:
        raise not_found("node", name)
    await sched.set_flags(name, _NODE_FLAGS[action])
    log.info("node %s: %s, by %s", name, action, _who(request))
    f = sched.flags(name)
    return json_response({"name": name, "cordoned": f.cordoned, "draining": f.draining})


def _model_or_404(ctx: ApiContext, name: str) -> Model:
    model = ctx.catalog.get(name)
    if model is None:
        raise not_found("model", name)
    return model


def _parked(ctx: ApiContext, model: Model) -> bool:
    return ctx.scheduling is not None and not ctx.scheduling.awake(model)


def _view(ctx: ApiContext, model: Model) -> ModelView:
    replicas = replicas_by_model(ctx.nodes.nodes()).get(model.name, [])
    view = model_view(model, replicas, _parked(ctx, model))
    if ctx.mirror is not None and sources.is_hf(model.source):
        view.mirror = ctx.mirror.set_status(model.source)
    return view


async def list_models(request: web.Request) -> web.Response:
    """GET /models: the catalog with each model's replicas."""
    ctx = _ctx(request)
    by_model = replicas_by_model(ctx.nodes.nodes())
    return json_response(
        [model_view(m, by_model.get(m.name, []), _parked(ctx, m)) for m in ctx.catalog.all()]
    )


async def get_model(request: web.Request) -> web.Response:
    """GET /models/{name}"""
    ctx = _ctx(request)
    return json_response(_view(ctx, _model_or_404(ctx, request.match_info["name"])))


async def add_model(request: web.Request) -> web.Response:
    """POST /models: put a new model in the catalog (not served until /serve)."""
    ctx = _ctx(request)
    model = validate_model(await read_body(request, ModelIn))
    if ctx.catalog.get(model.name) is not None:
        raise ApiError(
            409, f"model {model.name!r} already exists", "conflict_error", "model_exists"
        )
    if sources.is_hf(model.source):
        return await _add_hf(request, ctx, model)
    shape, why = await asyncio.to_thread(read_shape, model.source)
    model = msgspec.structs.replace(model, shape=shape, shape_error=why)
    if why:
        log.warning("model %s: %s", model.name, why)
    try:
        model = await ctx.catalog.add_model(model)
    except CatalogError as e:
        raise ApiError(409, str(e), "conflict_error", "model_exists") from None
    log.info("model %s added (%s) by %s", model.name, model.source, _who(request))
    return json_response(_view(ctx, model), 201)


async def _add_hf(request: web.Request, ctx: ApiContext, model: Model) -> web.Response:
    """An hf: model: the mirror pins it and starts fetching its set; its shape is read from
    the mirror's copy once fetched (llmgwd.mirror.shapes)."""
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
    from llmgwd.mirror.shapes import shape_of_set

    shape, why = await asyncio.to_thread(shape_of_set, ctx.mirror.store, files)
    model = msgspec.structs.replace(
        model, source=str(pinned), files=files, shape=shape, shape_error=why
    )
    try:
        model = await ctx.catalog.add_model(model)
    except CatalogError as e:
        raise ApiError(409, str(e), "conflict_error", "model_exists") from None
    log.info(
        "model %s added (%s, %d files) by %s", model.name, model.source, len(files), _who(request)
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
    ctx = _ctx(request)
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
    log.info("model %s: %d replicas wanted, by %s", name, replicas, _who(request))
    return json_response(_view(ctx, model))


def with_profile_replicas(model: Model, body: ProfileReplicasIn) -> list[Profile]:
    """The model's profiles with one profile's count set (a new one made, a cpu or gpu)."""
    profiles = profiles_of(model)
    names = [p.name for p in profiles]
    if body.profile in names:
        i = names.index(body.profile)
        priority = profiles[i].priority if body.priority is None else body.priority
        profiles[i] = msgspec.structs.replace(
            profiles[i], replicas=body.replicas, priority=priority
        )
        return profiles
    kind = body.kind or ("gpu" if body.profile.startswith("gpu") else "cpu")
    if kind not in ("cpu", "gpu"):
        raise bad_field("kind", "must be cpu or gpu")
    new = Profile(
        name=body.profile,
        kind="gpu" if kind == "gpu" else "cpu",
        engine=model.engine,
        args=list(model.args),
        replicas=body.replicas,
        priority=body.priority or 0,
        cores=0 if kind == "gpu" else 1,
    )
    return [*profiles, new]


async def set_profile_replicas(request: web.Request) -> web.Response:
    """POST /models/{name}/replicas {profile, replicas, kind?, priority?}"""
    ctx = _ctx(request)
    name = request.match_info["name"]
    model = _model_or_404(ctx, name)
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
        _who(request),
    )
    return json_response(_view(ctx, model))


async def set_context(request: web.Request) -> web.Response:
    """PUT /models/{name}/context {context}: tokens (0: as the model was trained)."""
    ctx = _ctx(request)
    name = request.match_info["name"]
    model = _model_or_404(ctx, name)
    body = await read_body(request, ContextIn)
    if not 0 <= body.context <= MAX_CONTEXT:
        raise bad_field("context", f"must be between 0 and {MAX_CONTEXT}")
    if model.max_tokens and body.context and model.max_tokens > body.context:
        raise bad_field("context", f"is below the model's max_tokens ({model.max_tokens})")
    model = await _update(ctx, name, context=body.context)
    log.info("model %s: context %d, by %s", name, body.context, _who(request))
    return json_response(_view(ctx, model))


class PlaceView(msgspec.Struct, kw_only=True):
    """Where a replica runs (a placement, as `llmgw model plan` shows it)."""

    id: str
    node: str
    devices: list[str]
    context: int
    memory: str


class ProfilePlan(msgspec.Struct, kw_only=True):
    """One profile of a plan: its replicas, and where one more would go or why not."""

    name: str
    kind: str
    replicas: int
    priority: int
    placed: list[PlaceView]
    verdicts: list[Verdict]


class PlanView(msgspec.Struct, kw_only=True):
    """GET /models/{name}/plan"""

    model: str
    estimates: bool  # False: the file's shape is unknown, placed by count only
    note: str
    parked: bool
    profiles: list[ProfilePlan]
    failed_on: list[str]  # nodes where the model failed to start


async def get_plan(request: web.Request) -> web.Response:
    """GET /models/{name}/plan: where each replica is and would go, or why not."""
    ctx = _ctx(request)
    sched = _scheduling(ctx)
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


async def serve_model(request: web.Request) -> web.Response:
    """POST /models/{name}/serve {replicas}: how many replicas to run."""
    body = await read_body(request, ServeIn)
    if not 0 <= body.replicas <= MAX_REPLICAS:
        raise bad_field("replicas", f"must be between 0 and {MAX_REPLICAS}")
    ctx = _ctx(request)
    model = ctx.catalog.get(request.match_info["name"])
    if ctx.mirror is not None and model is not None and model.files and body.replicas:
        ctx.mirror.fetch(model.source, list(model.files))  # a set that failed: try again now
    return await _set_replicas(request, body.replicas)


async def stop_model(request: web.Request) -> web.Response:
    """POST /models/{name}/stop: no replicas (the model stays in the catalog)."""
    return await _set_replicas(request, 0)


async def remove_model(request: web.Request) -> web.Response:
    """DELETE /models/{name}[?files=true]: out of the catalog (its replicas are stopped); with
    files, its files no other model uses are deleted from the mirror and the nodes."""
    from llmgwd import api_mirror

    ctx = _ctx(request)
    name = request.match_info["name"]
    files = request.query.get("files", "false")
    if files not in ("true", "false"):
        raise bad_field("files", "must be true or false")
    model = _model_or_404(ctx, name)
    try:
        await ctx.catalog.remove_model(name)
    except CatalogError:
        raise not_found("model", name) from None
    log.info("model %s removed by %s", name, _who(request))
    if files == "true" and model.files:
        swept = await api_mirror.remove_files_of(ctx, model)
        return json_response({"name": name, "removed": True, "files": swept})
    return json_response({"name": name, "removed": True})


async def list_keys(request: web.Request) -> web.Response:
    """GET /keys: every key, oldest first, without secrets."""
    keys = _ctx(request).catalog.keys()
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
    ctx = _ctx(request)
    body = await read_body(request, KeyIn)
    role = _check_key_in(ctx, body)
    limits = _checked(meter_views.apply_limits, KeyLimits(), body.limits or LimitsIn())
    key, secret = await ctx.catalog.create_key(body.name.strip(), role, limits)
    log.info("key %s (%s, %s) created by %s", key.id, key.name, key.role, _who(request))
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
    ctx = _ctx(request)
    key = _find_key(ctx, request.match_info["key"])
    if not key.revoked:
        try:
            key = await ctx.catalog.revoke_key(key.id)
        except CatalogError:
            raise not_found("key", key.id) from None
        log.info("key %s (%s) revoked by %s", key.id, key.name, _who(request))
    return json_response(key_view(key))


async def set_key_limits(request: web.Request) -> web.Response:
    """PATCH /keys/{key}/limits: change the limits given, keep the others (0 removes one)."""
    ctx = _ctx(request)
    key = _find_key(ctx, request.match_info["key"])
    limits = _checked(meter_views.apply_limits, key.limits, await read_body(request, LimitsIn))
    try:
        key = await ctx.catalog.set_key_limits(key.id, limits)
    except CatalogError:
        raise not_found("key", key.id) from None
    log.info("key %s (%s) limits set to %s by %s", key.id, key.name, limits, _who(request))
    return json_response(key_view(key))


async def set_price(request: web.Request) -> web.Response:
    """PUT /models/{name}/price {prompt, completion}: per million tokens."""
    ctx = _ctx(request)
    name = request.match_info["name"]
    _model_or_404(ctx, name)
    body = await read_body(request, PriceIn)
    _checked(meter_views.check_price, body)
    try:
        model = await ctx.catalog.update_model(
            name, price_prompt=body.prompt, price_completion=body.completion
        )
    except CatalogError:
        raise not_found("model", name) from None
    log.info("model %s priced %s/%s by %s", name, body.prompt, body.completion, _who(request))
    return json_response(_view(ctx, model))


async def get_usage(request: web.Request) -> web.Response:
    """GET /usage?by=key|model|day&since=YYYY-MM-DD: usage summed, counts not flushed too."""
    ctx = _ctx(request)
    by = _checked(meter_views.parse_group, "by", request.query.get("by"))
    since = _checked(meter_views.parse_day, "since", request.query.get("since"))
    keys = ctx.catalog.keys()
    names = {k.id: k.name for k in keys}
    records = await ctx.usage.records(since)
    return json_response(meter_views.report(records, by, since, names))


def _checked(check: Callable[..., T], *args: object) -> T:
    """check(*args), its Invalid as a 400 naming the field."""
    try:
        return check(*args)
    except Invalid as e:
        raise bad_field(e.param, str(e)) from None


async def create_token(request: web.Request) -> web.Response:
    """POST /tokens: a new join token and the command a node joins with."""
    ctx = _ctx(request)
    token = ctx.mint_token()
    await ctx.catalog.add_token(token, ctx.token_ttl_s)
    log.info("join token made by %s", _who(request))
    command = f"llmgw node join {shlex.quote(ctx.join_url)} --token {shlex.quote(token)}"
    view = TokenView(
        token=token, expires_in=int(ctx.token_ttl_s), url=ctx.join_url, command=command
    )
    return json_response(view, 201)


def api_routes() -> list[web.RouteDef]:
    """The routes, relative to API_PREFIX."""
    from llmgwd import api_mirror, api_nodes, api_people, api_servers, api_slurm  # on its helpers

    return [
        *api_people.routes(),
        *api_slurm.routes(),
        *api_nodes.routes(),
        *api_mirror.routes(),
        *api_servers.routes(),
        web.get("/status", get_status),
        web.get("/nodes", get_nodes),
        web.get("/models", list_models),
        web.post("/models", add_model),
        web.get("/models/{name}", get_model),
        web.delete("/models/{name}", remove_model),
        web.post("/models/{name}/serve", serve_model),
        web.post("/models/{name}/stop", stop_model),
        web.post("/models/{name}/replicas", set_profile_replicas),
        web.put("/models/{name}/context", set_context),
        web.get("/models/{name}/plan", get_plan),
        web.post("/nodes/{name}/{action:cordon|drain|uncordon}", set_node_flags),
        web.get("/keys", list_keys),
        web.post("/keys", create_key),
        web.delete("/keys/{key}", revoke_key),
        web.patch("/keys/{key}/limits", set_key_limits),
        web.put("/models/{name}/price", set_price),
        web.get("/usage", get_usage),
        web.post("/tokens", create_token),
    ]


def api_subapp(ctx: ApiContext, auth: Middleware) -> web.Application:
    """The API to mount with parent.add_subapp(API_PREFIX, ...), guarded by auth."""
    app = web.Application(middlewares=[errors_middleware, auth], client_max_size=MAX_BODY_BYTES)
    app[CTX] = ctx
    app.add_routes(api_routes())
    return app


def api_app(ctx: ApiContext, auth: Middleware) -> web.Application:
    """A whole application serving the API under API_PREFIX (the Unix socket's)."""
    app = web.Application()
    app.add_subapp(API_PREFIX, api_subapp(ctx, auth))
    return app


# Auth.


_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="llmgw"'}


def _deny(status: int, message: str, code: str) -> NoReturn:
    if status == 401:
        raise ApiError(401, message, "authentication_error", code, headers=_CHALLENGE)
    raise ApiError(status, message, "permission_error", code)


def peercred_auth(group: str) -> Middleware:
    """Auth for the Unix socket: the caller's kernel-given credentials, no key."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        cred = peer_credentials(request)
        if cred is None:
            _deny(403, "this API answers local callers on its Unix socket only", "not_local")
        pid, uid, gid = cred
        if not allowed(uid, gid, group):
            _deny(403, f"uid {uid} is neither root nor in the {group} group", "not_allowed")
        request[PRINCIPAL] = f"uid {uid} (pid {pid})"
        return await handler(request)

    return middleware


def _bearer(request: web.Request) -> str | None:
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    return secret.strip() or None if scheme.lower() == "bearer" else None


def key_auth(keys: KeyLookup) -> Middleware:
    """Auth for the client port: an admin API key as `Authorization: Bearer KEY`."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        secret = _bearer(request)
        if secret is None:
            _deny(401, "an admin API key is needed: Authorization: Bearer KEY", "missing_key")
        key = keys.authenticate(secret)
        if key is None:
            _deny(401, "the API key is not valid (or was revoked)", "invalid_key")
        if key.role != "admin":
            _deny(403, f"key {key.id} ({key.name}) is not an admin key", "not_admin")
        request[PRINCIPAL] = f"key {key.id} ({key.name})"
        return await handler(request)

    return middleware
