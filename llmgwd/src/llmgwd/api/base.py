"""The context, errors, bodies and helpers every /api/v1 resource module shares."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler

from llmgw import package_version, wire
from llmgw.api_types import NodeView, SlurmNodeView
from llmgw.errors import API_V1, ApiError
from llmgwd import auth
from llmgwd.accounting.usage import Usage
from llmgwd.accounting.views import Invalid
from llmgwd.catalog import ApiKey, Catalog, Model
from llmgwd.nodes import engine_support
from llmgwd.placement.profiles import Profile
from llmgwd.placement.reconciler import Failure, NodeFlags
from llmgwd.placement.scheduler import Placement, Verdict
from llmgwd.providers.credentials import Credentials
from llmgwd.store import StoreUnavailable

if TYPE_CHECKING:
    from llmgwd.mirror.service import Mirror
    from llmgwd.mirror.sweep import NodeFiles
    from llmgwd.planes.listing import ControlPlanes
    from llmgwd.router.rates import Rates
    from llmgwd.slurm.settings import SettingsStore


log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"


# The API's node (api_types.NodeView), under the name the handlers and tests know it by;
# ClusterNodes builds it from the cluster state's records.
NodeInfo = NodeView


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
                cards=list(n.inventory.gpus),
                disks=list(n.inventory.disks),
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

    def rollout(self, model: Model) -> str:
        """The model's replicas' roll to new settings, as people read it ("" when none)."""
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
    ca_fingerprint: str = ""  # sha256 of the cluster CA's DER (what a context pins)
    token_ttl_s: float = 3600.0
    name: str = "llmgw"
    mode: str = "cluster"  # server.yaml's: cluster, or mirror (llmgwd.mirror_only)
    as_peer: str = ""  # a mirror alone: what a control plane runs to copy from it
    version: str = field(default_factory=package_version)
    started_at: float = field(default_factory=time.time)
    usage: Usage = field(default_factory=lambda: Usage(None))  # the router's counts
    scheduling: Scheduling | None = None  # the reconciler; None: nothing is placed here
    # `llmgw node remove`: revoke a node's certificates and forget it; whether it was known
    # (a name not known here is revoked all the same).
    remove_node: Callable[[str], Awaitable[bool]] | None = None
    mirror: Mirror | None = None  # None: hf: sources are refused here
    node_files: NodeFiles | None = None  # the nodes' caches, for sweeps
    control_planes: ControlPlanes | None = None  # /planes: None, this llmgwd keeps none
    slurm: SettingsStore | None = None  # /slurm: None, Slurm's settings are not kept here
    # Each node's standing between llmgw and Slurm (Roles.slurm_status; None: a standby's)
    slurm_status: Callable[[], list[SlurmNodeView] | None] | None = None
    traffic: Rates | None = None  # this plane's own /v1 rates (None: requests not counted)
    credentials: Credentials | None = None  # seals providers' credentials (None: refused)


CTX = web.AppKey("llmgw.api", ApiContext)


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
    """The JSON answer of an ApiError, in /api/v1's shape (ErrorAnswer)."""
    return API_V1.response(err)


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
        allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None  # a 405's
        return error_response(ApiError(e.status, e.reason, type_, code, headers=allow))
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


T = TypeVar("T")


# The largest body: read_body counts it itself, since a sub-app's client_max_size is not
# applied (the client port's application reads with its own, /v1's 4 MB).
MAX_BODY_BYTES = 64 * 1024
_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_MISSING = re.compile(r"Object missing required field `(?P<f>[^`]+)`")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<f>[^`]+)`")


def _field_rule(schema: type, param: str) -> str | None:
    """What a field's type says it must be (its msgspec.Meta description), if it says."""
    info = msgspec.inspect.type_info(schema)
    fields = info.fields if isinstance(info, msgspec.inspect.StructType) else ()
    for f in fields:
        if f.encode_name != param:
            continue
        kinds = f.type.types if isinstance(f.type, msgspec.inspect.UnionType) else (f.type,)
        for t in kinds:
            if isinstance(t, msgspec.inspect.Metadata) and t.extra_json_schema:
                return t.extra_json_schema.get("description")
    return None


def _validation_error(message: str, schema: type) -> ApiError:
    """msgspec's '... - at `$.field`' as a 400 that names the field, and says what the field's
    type says it must be where it says (rather than a pattern or bound)."""
    for pattern, why in ((_MISSING, "is required"), (_UNKNOWN, "is not a known field")):
        m = pattern.match(message)
        if m:
            return bad_field(m.group("f"), why)
    at = _AT.search(message)
    if at is None:
        return ApiError(400, f"body: {message}", "invalid_request_error", "invalid_body", "body")
    param = re.sub(r"\[\d+\]$", "", at.group("path")) or "body"
    rule = _field_rule(schema, param)
    return bad_field(param, rule or message[: at.start()])


async def read_body(request: web.Request, schema: type[T], limit: int = MAX_BODY_BYTES) -> T:
    """Decode the JSON body into schema, or raise a 400 naming the field."""
    raw = await _read_limited(request, limit)
    try:
        return msgspec.json.decode(raw or b"{}", type=schema)
    except msgspec.ValidationError as e:
        raise _validation_error(str(e), schema) from None
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


def api_context(request: web.Request) -> ApiContext:
    """The API's context (what the daemon supplied) for a request's handler."""
    return request.config_dict[CTX]


def caller(request: web.Request) -> str:
    """Who calls, for the log (never a secret)."""
    who = request.get(auth.PRINCIPAL)
    return who.label if who is not None else "?"


def scheduling_of(ctx: ApiContext) -> Scheduling:
    """The reconciler, or a 503 where none runs."""
    if ctx.scheduling is None:
        raise ApiError(503, "no scheduler runs here", "server_error", "no_scheduler")
    return ctx.scheduling


def checked(check: Callable[..., T], *args: object) -> T:
    """check(*args), its Invalid as a 400 naming the field."""
    try:
        return check(*args)
    except Invalid as e:
        raise bad_field(e.param, str(e)) from None
