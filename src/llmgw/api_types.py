"""/api/v1's error body and some of its requests and answers: one definition for llmgwd and
the llmgw command (the rest are still llmgwd's own, in llmgwd/api/)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from llmgw.mirror_api import SetStatus

# The checks a handler makes on a request's fields, said in the types so that the OpenAPI
# document states them (and msgspec refuses a body that breaks them, naming the field).
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
NAME_RULE = "must be 1-64 of a-z 0-9 . _ - and start with a letter or digit"
Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, description=NAME_RULE)]
Email = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^(|[^@\s]{1,64}@[^@\s]{1,255})$", description="must look like name@domain"
    ),
]
Title = Annotated[str, msgspec.Meta(max_length=200)]


class ErrorBody(msgspec.Struct, omit_defaults=True):
    """The body of an error answer."""

    message: str
    type: str
    code: str
    param: str | None = None  # the request field at fault, for a 400


class ErrorAnswer(msgspec.Struct):
    """Every /api/v1 error answer: {"error": {"message", "type", "code", "param"?}}."""

    error: ErrorBody


class TokenView(msgspec.Struct, kw_only=True):
    """POST /tokens: a new join token and the command that uses it."""

    token: str
    expires_in: int
    url: str
    command: str


class NodeFlagsView(msgspec.Struct, kw_only=True):
    """POST /nodes/{name}/cordon|drain|uncordon: what the node's flags are now."""

    name: str
    cordoned: bool
    draining: bool


class OidcInfo(msgspec.Struct, kw_only=True):
    """GET /login/oidc: what `llmgw login` needs to send a person to the provider."""

    issuer: str
    authorization_endpoint: str
    client_id: str
    scopes: list[str]


class OidcLogin(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /login/oidc: a sign-in's code (with its PKCE verifier and redirect), which llmgwd
    trades for the ID token, or the ID token itself; the nonce sent to the provider."""

    nonce: str
    code: str = ""
    code_verifier: str = ""
    redirect_uri: str = ""
    id_token: str = ""


class LoginAnswer(msgspec.Struct, kw_only=True):
    """POST /login/oidc: the signed-in user and their session's key (shown once)."""

    user: str  # the user's id
    name: str
    key: str
    expires_at: float


# GET /models and the model routes: a model, its profiles and its replicas.
Engine = Literal["llama.cpp", "vllm"]
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


# GET /keys, POST /keys: keys and their limits.
Period = Literal["day", "month"]  # budgets' periods, in UTC


class KeyLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What one key may use; 0 means no limit."""

    rpm: int = 0  # requests per minute
    tpm: int = 0  # tokens (prompt + completion) per minute
    budget_tokens: int = 0  # tokens per budget_tokens_per
    budget_tokens_per: Period = "day"
    budget_spend: float = 0.0  # money per budget_spend_per, in the prices' currency
    budget_spend_per: Period = "day"


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
