"""/api/v1's error body, answers and some of its requests: one definition for llmgwd and the
llmgw command, which decodes the answers into them."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from llmgw import wire
from llmgw.mirror_api import SetStatus, SweepOut

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
ExternalId = Annotated[
    str,
    msgspec.Meta(
        max_length=256,
        pattern=r"^(|[^\s\x00-\x1f\x7f](.*[^\s\x00-\x1f\x7f])?)$",
        description="the person's id at the identity provider (SCIM's externalId): their "
        "first OIDC sign-in whose link claim (oidc.link_claim, by default sub) equals it is "
        "theirs; at most 256 printable characters, unpadded",
    ),
]


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
    """POST /tokens, POST /servers/tokens: a new join token and the command that uses it."""

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


class LevelView(msgspec.Struct, kw_only=True):
    """GET, PATCH /orgs/{org}/limits..., /users/{user}/limits: one level's limits and the
    models it may use ([]: every model)."""

    level: str  # org:ORG, team:ORG:TEAM, project:ORG:PROJECT, user:ID
    limits: KeyLimits
    models: list[str]


class ScimTokenView(msgspec.Struct, kw_only=True):
    """POST /scim/token: the identity provider's new SCIM token, this once (the old one stops)."""

    token: str
    path: str = "/scim/v2"


class MetricsTokenView(msgspec.Struct, kw_only=True):
    """POST /metrics/token: Prometheus' new scrape token, this once (the old one stops); it
    reads /metrics and /metrics/engines on the client port and nothing else."""

    token: str
    path: str = "/metrics"


# GET /nodes, DELETE /nodes/{name}: the nodes as the cluster state reports them.
class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    """One node as the cluster state knows it (the GET /nodes item)."""

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
    note: str = ""  # what people should know of it
    firewall: str = ""  # its nftables table: "ok", or why not set


class NodeRemoved(msgspec.Struct, kw_only=True):
    """DELETE /nodes/{name}: the name revoked, and whether a node of it was known here."""

    name: str
    removed: bool
    known: bool


class ModelRemoved(msgspec.Struct, kw_only=True, omit_defaults=True):
    """DELETE /models/{name}: the model gone, and with ?files=true what was swept."""

    name: str
    removed: bool
    files: SweepOut | None = None


# GET /status: the cluster at a glance.
class NodeCounts(msgspec.Struct, kw_only=True):
    """The nodes known, and those connected now."""

    total: int
    connected: int


class ModelCounts(msgspec.Struct, kw_only=True):
    """The models of the catalog, and those with replicas wanted."""

    total: int
    served: int


class ReplicaCounts(msgspec.Struct, kw_only=True):
    """The replicas wanted, and those ready."""

    wanted: int
    ready: int


class StatusView(msgspec.Struct, kw_only=True):
    """GET /status"""

    name: str
    version: str  # llmgwd's
    uptime_s: float
    join_url: str
    nodes: NodeCounts
    models: ModelCounts
    replicas: ReplicaCounts


# GET /usage, GET /orgs/{org}/usage: usage summed by a group.
class UsageRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Usage summed over one key, model, day, organization, team, project or user (only the
    grouping field is shown; "" for keys of no organization, team, project or user)."""

    key: str | None = None
    name: str | None = None  # the key's name ("" for a key no longer known), grouped by key
    model: str | None = None
    day: str | None = None
    org: str | None = None
    team: str | None = None  # ORG/TEAM
    project: str | None = None  # ORG/PROJECT
    user: str | None = None  # the user's id
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    spend: float


class UsageReport(msgspec.Struct, kw_only=True):
    """GET /usage"""

    by: str
    since: str
    rows: list[UsageRow]
    total: UsageRow


# GET /slurm, PUT /slurm, POST /slurm/nodes/{name}/lend|reclaim
class SlurmNodeView(msgspec.Struct, frozen=True, kw_only=True):
    """A node of Slurm's: where it stands between llmgw and Slurm."""

    name: str
    status: str  # "lent", "lending: ...", "reclaiming: N jobs running", "in llmgw"
    held: bool  # Slurm holds it from llmgw's scheduler (cordoned or draining there)
    state: str = ""  # Slurm's state of it, as its agent reports it ("": none reported)
    reason: str = ""  # why Slurm has it drained or down
    jobs: list[str] = []
    version: str = ""  # Slurm's
    message: str = ""  # what failed last on the node, or why it is not held


class SlurmView(msgspec.Struct, frozen=True, kw_only=True):
    """Slurm's settings, and each node's standing as the leader sees it (None: asked of a
    standby, which knows none: ask the leader)."""

    enabled: bool = False
    cluster_name: str = "llmgw"
    controller: str = ""  # the node that runs slurmctld
    nodes: list[str] = []  # the nodes in Slurm (slurmd runs there)
    lent: list[str] = []  # the nodes of those lent to Slurm; the others are drained there
    partition: str = "llmgw"
    status: list[SlurmNodeView] | None = None


# GET /servers, POST /servers/leave, DELETE /servers/{name}: the control planes.
Health = Literal["healthy", "unreachable", "not started", "no member"]


class ServerView(msgspec.Struct, frozen=True, kw_only=True):
    """One control plane, as GET /servers shows it."""

    name: str
    url: str = ""  # its cluster port, from its record ("" when it has none: not running)
    member: str = ""  # its etcd member's id, hex ("" without one)
    peer_url: str = ""
    health: Health = "no member"
    role: str = ""  # "leader", "standby", or "" when it runs no llmgwd now
    learner: bool = False  # its member is a learner: joined, not yet promoted to a voter
    self: bool = False  # the control plane that answered


class ServerRemoved(msgspec.Struct, kw_only=True):
    """POST /servers/leave, DELETE /servers/{name}: the control plane taken out."""

    name: str
    member: str  # its etcd member's id, hex
    removed: bool


class UploadView(msgspec.Struct, kw_only=True):
    """PUT /mirror/uploads/{sha256}: one file of an import, received and checked."""

    sha256: str
    size: int


# /login/device: `llmgw login --device`, the device authorization grant through llmgwd (which
# holds the client secret and checks the ID token); issue 13.
class DeviceStart(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /login/device: start a device sign-in; the nonce the CLI made for it."""

    nonce: str


class DeviceAuthorization(msgspec.Struct, kw_only=True):
    """POST /login/device: what the person is shown, and the code the CLI polls with (of use
    only with llmgwd's client secret)."""

    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str = ""
    expires_in: int  # seconds
    interval: int  # seconds between polls


class DevicePoll(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /login/device/token: one poll, with the interval the CLI keeps now."""

    device_code: str
    nonce: str
    interval: int = 5


class DevicePending(msgspec.Struct, kw_only=True):
    """POST /login/device/token, 202: not signed in yet; poll again after interval seconds."""

    status: Literal["authorization_pending", "slow_down"]
    interval: int


# People (llmgwd/api/people.py, person_keys.py): organizations, teams, projects, memberships,
# users, staff roles and people's keys, as /api/v1 answers them.

PersonRole = Literal["admin", "manager", "member"]
StaffRoleName = Literal["admin", "operator", "viewer"]


class OrgView(msgspec.Struct, kw_only=True):
    """An organization: GET /orgs, GET /orgs/{org}, POST /orgs."""

    name: str
    title: str = ""  # shown to people; the name is the handle
    created_at: float = 0.0


class TeamView(msgspec.Struct, kw_only=True):
    """A team of an organization: GET and POST /orgs/{org}/teams."""

    org: str
    name: str
    title: str = ""
    created_at: float = 0.0


class ProjectView(msgspec.Struct, kw_only=True):
    """A project of an organization, in one of its teams or not (team ""): GET and POST
    /orgs/{org}/projects."""

    org: str
    name: str
    team: str = ""
    title: str = ""
    created_at: float = 0.0


class ScopeView(msgspec.Struct, kw_only=True):
    """Where a membership holds: the organization (kind org, name ""), or a team or project."""

    org: str
    kind: Literal["org", "team", "project"] = "org"
    name: str = ""


class MembershipView(msgspec.Struct, kw_only=True):
    """A user's role in a scope: GET /orgs/{org}/members, PUT .../members/{user}."""

    user: str  # the user's id
    scope: ScopeView
    role: PersonRole
    set_by: Literal["hand", "group"] = "hand"  # a group's rule never rewrites a hand's
    group: str = ""  # the group whose rule set it
    sources: dict[Literal["oidc", "scim"], PersonRole] = {}  # each group source's role
    updated_at: float = 0.0


class UserView(msgspec.Struct, kw_only=True):
    """A user: GET /users, /users/{user}, POST /users, PATCH /users/{user}."""

    id: str  # 12 hex digits, never reused
    name: str
    email: str = ""
    source: Literal["oidc", "scim", "staff"] = "staff"
    active: bool = True
    created_at: float = 0.0
    external_id: str = ""  # who they are at the identity provider; "": none


class StaffView(msgspec.Struct, kw_only=True):
    """PUT /users/{user}/staff: the user's staff role now (null: none)."""

    user: str
    staff: StaffRoleName | None


class Deleted(msgspec.Struct, kw_only=True):
    """DELETE /orgs/{org}, .../teams/{team}, .../projects/{project}: the name gone."""

    name: str
    deleted: bool


class UserDeleted(msgspec.Struct, kw_only=True):
    """DELETE /users/{user}: the user's id, gone (their keys revoked)."""

    user: str
    deleted: bool


class MemberRemoved(msgspec.Struct, kw_only=True):
    """DELETE .../members/{user}: the user's id, their membership there gone."""

    user: str
    removed: bool


class PersonKeyView(msgspec.Struct, kw_only=True):
    """A person's key without its secret or hash; key is set only in the answer that made it
    (/me/keys, /orgs/{org}/projects/{project}/keys and service-keys)."""

    id: str
    name: str
    prefix: str
    user: str  # its maker's id
    org: str
    project: str  # "": a staff key
    service: bool
    created_at: float
    revoked: bool
    limits: KeyLimits
    key: str = ""
