"""/api/v1's models: a model to add and its changes (replicas, context, price); a model, its
profiles, replicas and plan, and its removal."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from llmgw.api_types.common import Name
from llmgw.api_types.limits import Money
from llmgw.api_types.mirror import SetStatus, SweepOut

MAX_REPLICAS = 1024
MAX_CONTEXT = 1 << 24
SOURCE_PATTERN = r"^(?:hf:\S+|file:/(?!/)[^\x00-\x1f]*)$"
SOURCE_RULE = "must be hf:ORG/REPO[@REV][:PATTERN] or file:/absolute/path (on the nodes)"

Replicas = Annotated[int, msgspec.Meta(ge=0, le=MAX_REPLICAS)]
Context = Annotated[int, msgspec.Meta(ge=0, le=MAX_CONTEXT)]
MAX_CARDS_PER_REPLICA = 64  # one node's cards at most: a replica is split over one node's
CardsPerReplica = Annotated[int, msgspec.Meta(ge=1, le=MAX_CARDS_PER_REPLICA)]


class ModelIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /api/v1/models"""

    name: Name
    # hf:ORG/REPO[@REV][:PATTERN], or file: and an absolute path (no control character)
    source: Annotated[str, msgspec.Meta(pattern=SOURCE_PATTERN, description=SOURCE_RULE)]
    engine: Literal["llama.cpp", "vllm", "freetoken"]
    args: list[str] = []
    context: Context = 0
    max_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0
    on_demand: bool = False  # started by the first request, parked after idle_s without one
    idle_s: Annotated[int, msgspec.Meta(ge=1, le=604800)] = 300


class ServeIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST /api/v1/models/{name}/serve"""

    replicas: Replicas


class ProfileReplicasIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /api/v1/models/{name}/replicas: a profile's count (a new profile is made)."""

    profile: Name
    replicas: Replicas
    # for a new profile: cpu or gpu ("": gpu if its name starts so, else cpu)
    kind: Literal["", "cpu", "gpu"] = ""
    priority: int | None = None
    # a gpu profile's cards a replica, the model split across them (None: kept, or 1 if new)
    gpus: CardsPerReplica | None = None


class ContextIn(msgspec.Struct, forbid_unknown_fields=True):
    """PUT /api/v1/models/{name}/context"""

    context: Context
    # the longest answer set with it, never past it (None: kept; 0: the context)
    max_tokens: Context | None = None


class MaxTokensIn(msgspec.Struct, forbid_unknown_fields=True):
    """PUT /api/v1/models/{name}/max_tokens"""

    max_tokens: Context  # 0: the context


class PriceIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """PUT /models/{name}/price: per million tokens, in the site's currency."""

    prompt: Money
    completion: Money


# GET /models and the model routes: a model, its profiles and its replicas.
Engine = Literal["llama.cpp", "vllm", "freetoken"]
Kind = Literal["gpu", "cpu"]
CacheType = Literal["f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl", "fp8"]


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    """One way to run a model and how many replicas of it are wanted that way.

    A model's replicas are the sum of its profiles' replicas; the router fills the profile
    with the highest priority first.
    """

    name: str  # "gpu", "cpu", or a site's own ("gpu-long")
    kind: Kind  # on cards (or MIG instances), or on CPU cores and RAM
    engine: Engine = "llama.cpp"
    engine_version: str = ""  # what the agent installs for it; "": the agent's default
    args: list[str] = []  # passed to the engine after the ones llmgw sets
    replicas: int = 0
    priority: int = 0  # higher first
    context: int = 0  # tokens; 0: the model's (Model.context, else as trained)
    min_context: int = 2048  # a place holding less than this is no place for it
    cache_type: CacheType | None = None  # KV cache type; None: the engine's default (f16)
    gpus: int = 1  # kind gpu: cards per replica, the model split across them (whole cards)
    cores: int = 0  # kind cpu: cores per replica; 0: all the node's cores
    min_compute_capability: str = ""  # "8.0": cards below it are no place (an engine build's)


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
    # Its replicas' roll to new settings (a restart, a context change): how many are left
    # and how, or why it halted; "" when none runs.
    rollout: str = ""


# GET /models/{name}/plan: where a model's replicas are and would go, or why not.
class Verdict(msgspec.Struct, frozen=True):
    """Whether a replica of a profile fits on a node's place ("" for the node as a whole)."""

    node: str
    place: str
    fits: bool
    context: int = 0
    memory_bytes: int = 0
    tokens_per_s: float = 0.0  # the CPU estimate, where it runs on CPUs
    reason: str = ""
    slots: int = 0  # requests it would serve at once there, each with the context


class PlaceView(msgspec.Struct, kw_only=True):
    """Where a replica runs (a placement, as `llmgw model plan` shows it)."""

    id: str
    node: str
    devices: list[str]
    context: int
    memory: str
    slots: int = 0  # requests it serves at once, each with the context; 0: the engine's own


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
    max_tokens: int = 0  # the model's longest answer, the reply reply_time.py times (0: none)


class ModelRemoved(msgspec.Struct, kw_only=True, omit_defaults=True):
    """DELETE /models/{name}: the model gone, and with ?files=true what was swept."""

    name: str
    removed: bool
    files: SweepOut | None = None
