"""Messages between llmgw-agentd and llmgwd on the cluster port: one definition for both sides."""

from __future__ import annotations

import re
from typing import Literal

import msgspec

# The cluster port's protocol: raised by a release that changes these messages so that an
# older side could not read them. A control plane takes agents that speak PROTOCOL down to
# OLDEST_AGENT_PROTOCOL, which a release sets to the PROTOCOL of the release before it: an
# agent one release behind its control planes keeps working (llmgw.compat says the rule).
PROTOCOL = 1
OLDEST_AGENT_PROTOCOL = 1

# "stopping": told to stop, its unit not gone yet (it takes no new request; a lent node
# waits for it). An agent reports it only to a control plane whose Desired says `stopping`.
ReplicaState = Literal["starting", "ready", "failed", "stopped", "stopping"]
Engine = Literal["llama.cpp", "vllm", "freetoken"]


class Disk(msgspec.Struct, frozen=True):
    """A mounted filesystem of the node."""

    path: str
    total_bytes: int
    free_bytes: int


class GpuCounters(msgspec.Struct, frozen=True):
    """A card's or a MIG instance's profiling counters over the agent's last report interval
    (NVML's GPM, Hopper and later), each a percentage; None: NVML did not tell it."""

    sm_active_percent: float | None = None  # share of SMs busy
    sm_occupancy_percent: float | None = None  # resident warps against the most possible
    tensor_active_percent: float | None = None  # share of time any tensor pipe ran
    dram_active_percent: float | None = None  # DRAM bandwidth used against its peak


class MigInstance(msgspec.Struct, frozen=True):
    """One MIG instance of a card: a place of its own, with its own id and its own memory."""

    uuid: str  # "MIG-...": what CUDA_VISIBLE_DEVICES names to run on this instance only
    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # "3g.40gb", as NVIDIA names the instance's slice of the card
    memory_total_bytes: int
    memory_free_bytes: int
    counters: GpuCounters | None = None  # None: no profiling counters (before Hopper)


class Gpu(msgspec.Struct, frozen=True):
    """One card as NVML reports it.

    A card in MIG mode is no place itself: engines run on its instances, each with its own
    memory; the card's memory figures are the whole card's and are never offered as one place.
    """

    index: int  # NVML's index of the card
    uuid: str  # "GPU-..."
    name: str  # "NVIDIA H100 80GB HBM3"
    memory_total_bytes: int
    memory_free_bytes: int
    compute_capability: str  # "9.0"
    mig: bool = False  # MIG mode is on: only the instances are places
    instances: list[MigInstance] = []
    utilization_percent: int | None = None  # None: NVML does not tell (as on MIG cards)
    memory_utilization_percent: int | None = None
    power_draw_mw: int | None = None
    power_limit_mw: int | None = None
    # The card's device node is /dev/nvidiaMINOR (NVML's minor number, which need not be its
    # index); -1: not told (an agent older than this field: its index is taken).
    minor: int = -1
    # Profiling counters where NVML's GPM reads them (Hopper and later); never on a card in
    # MIG mode, whose instances carry their own.
    counters: GpuCounters | None = None


class Inventory(msgspec.Struct, frozen=True):
    """What a node has to run engines on. Fields after disks have defaults, so a message from
    an agent older than them still decodes (as a node without GPUs or a measured bandwidth)."""

    cores: int
    memory_bytes: int
    memory_free_bytes: int
    disks: list[Disk] = []
    gpus: list[Gpu] = []
    gpu_driver_version: str = ""  # "550.54.15"; "" without NVIDIA's driver
    cuda_version: str = ""  # the newest CUDA the driver supports: "12.4"
    # Measured once at the agent's start, bytes read plus bytes written per second; 0: not
    # measured. All cores copying at once, and one core copying alone.
    memory_bandwidth_bytes_s: int = 0
    memory_bandwidth_one_core_bytes_s: int = 0
    # The CUDA toolkit's version where nvcc is installed ("12.4"); "": none, so llama.cpp is
    # not built for, nor offered, this node's cards.
    cuda_toolkit: str = ""
    # Engines this node can run, as "ENGINE:cpu" or "ENGINE:gpu" ("vllm:cpu", "llama.cpp:gpu");
    # []: an agent older than this field (llama.cpp on CPUs only).
    engines: list[str] = []
    # The node's nftables table (llmgw-agentd/firewall.py): "ok", "off" (not run on this
    # node), or why it could not be set ("nftables: ..."); "": an agent older than this field.
    firewall: str = ""
    # The node's Slurm as the agent sees it; None: it runs no Slurm of llmgw's (or is older).
    slurm: SlurmReport | None = None


class SlurmReport(msgspec.Struct, frozen=True):
    """The node's Slurm as its agent reports it (llmgw_agentd/slurm)."""

    version: str = ""  # "22.05.8", as slurmd -V says; "": not installed
    node_line: str = ""  # slurmd -C's first line: "NodeName=n1 CPUs=2 ... RealMemory=24105"
    state: str = ""  # the node's state in Slurm as sinfo says it ("idle", "drained"...)
    jobs: list[str] = []  # job ids running on the node now (slurmstepd's infinity is none)
    message: str = ""  # what failed last, for people ("": nothing)
    reason: str = ""  # why Slurm has the node drained or down, as it says ("": it is not)
    # The node's cgroups: "v2" (unified), "v1" (v1 or hybrid, where Slurm 22.05's cgroup/v2
    # plugin refuses to start: jobs are tracked without cgroups there), "": not known.
    cgroup: str = ""


# The reason llmgw gives Slurm for a node it has drained (one not lent). A drain with any other
# reason was made by someone else (a Slurm administrator) and llmgw never lifts it.
SLURM_NOT_LENT = "llmgw: not lent to Slurm"


class SlurmPart(msgspec.Struct, frozen=True):
    """A node's part in Slurm, as the leader tells it (Desired.slurm)."""

    slurmd: bool = False  # run slurmd, configless from conf_server
    slurmctld: bool = False  # run slurmctld here, on the files below
    conf_server: str = ""  # the controller's "HOST:6817"
    munge_key: str = ""  # base64 of the munge key (derived from the cluster secret)
    cluster_name: str = ""
    # The controller's files (slurmctld only; slurmd gets them from the controller):
    slurm_conf: str = ""
    gres_conf: str = ""
    cgroup_conf: str = ""
    # The controller only: the nodes to be up in Slurm (lent). Every other node of slurm.conf
    # is drained there with the reason SLURM_NOT_LENT, unless it is drained already.
    lent: list[str] = []
    # The addresses of every node in Slurm and of the controller: the node's firewall opens
    # Slurm's ports (6817-6818, srun's range) to these alone. []: to the node's own networks.
    peers: list[str] = []
    # A hash of slurm.conf: slurmd restarts when it changes (a node list that changed needs
    # it in 22.05), slurmctld likewise for its files.
    conf_hash: str = ""

    def __repr__(self) -> str:
        """Without the munge key: a Desired in a log line or a traceback shows no secret."""
        fields = [f"{f}={getattr(self, f)!r}" for f in self.__struct_fields__ if f != "munge_key"]
        return f"SlurmPart({', '.join(fields)})"


class ModelFile(msgspec.Struct, frozen=True):
    """One file of a model's set: where it sits in its repository, and how it is checked.

    Every file the mirror has published has a sha256 (the hub gives one for LFS files; the
    mirror computes it for the others and keeps the hub's git blob id beside it)."""

    path: str  # inside the repository: "model-00001-of-00002.safetensors", "sub/x.json"
    size: int
    sha256: str = ""  # hex
    git_oid: str = ""  # the hub's git blob id of a file not in LFS: sha1 of b"blob N\0" + bytes


class ReplicaSpec(msgspec.Struct, frozen=True):
    """One engine the control plane wants running on a node."""

    id: str
    model: str
    engine: Engine
    source: str  # "file:/path/to/model.gguf"
    args: list[str] = []
    context: int = 0  # 0: the engine's default
    api_key: str = ""  # derived from the cluster secret; only the router knows it too
    devices: list[str] = []  # GPU or MIG UUIDs: the engine's CUDA_VISIBLE_DEVICES; [] on CPUs
    profile: str = ""  # the model's profile this replica runs (for people and the router)
    priority: int = 0  # the profile's: the router fills higher ones first (no restart)
    # The unit's MemoryMax (engine_memory.limit of the placement's estimate); 0: the node's
    # default (a model placed by count, or a control plane older than this field).
    memory_max_bytes: int = 0
    # An hf: source's set, pinned ("hf:ORG/REPO@COMMIT"): the agent fetches each file from
    # the mirror by its sha256 into its cache before it starts the engine. [] for file:.
    files: list[ModelFile] = []
    # Fields after this one are left out of the fingerprint while unset (engines started
    # before them are kept). CPU cores the scheduler reserved: the unit's AllowedCPUs (the
    # agent picks which) and the engine's threads; 0: not pinned.
    cores: int = 0
    # The share of each card's memory the placement gives it (vLLM's
    # --gpu-memory-utilization); 0.0: on CPUs, or the engine's default.
    gpu_memory_fraction: float = 0.0
    cache_type: str = ""  # the profile's KV cache type ("f16", "q8_0", "fp8"...); "": default
    # Requests of different organizations (or keys) must not share cached prompts
    # (client.cache_isolation): llama-server keeps no prompt cache in RAM, which every slot
    # would load from (the router keeps its slots apart).
    isolated_cache: bool = False
    generation: int = 0  # the model's restart generation: a new one starts the engine again
    # Requests the engine serves at once, each with the whole context (the placement's
    # slots: llama.cpp's --parallel with --ctx-size context x slots); 0: the engine's own (a
    # model placed by count, a placement older than this field, vLLM: its --max-num-seqs).
    slots: int = 0

    def __repr__(self) -> str:
        # The api_key must never reach a log line through a spec's repr.
        return f"ReplicaSpec(id={self.id!r}, model={self.model!r}, source={self.source!r})"

    def fingerprint(self) -> str:
        """What, when it changes, means the running engine must be started again: not the
        profile's name or priority, nor devices or a memory limit while there are none (so an
        engine started before these fields existed is kept until one is given)."""
        import hashlib

        data = msgspec.to_builtins(self)
        del data["priority"], data["profile"]
        for unset in (
            "devices",
            "memory_max_bytes",
            "files",
            "cores",
            "gpu_memory_fraction",
            "cache_type",
            "isolated_cache",
            "generation",
            "slots",
        ):
            if not data[unset]:
                del data[unset]
        return hashlib.sha256(msgspec.json.encode(data)).hexdigest()[:16]


class ReplicaStatus(msgspec.Struct, frozen=True):
    """How one engine on the node is doing, as its agent sees it."""

    id: str
    model: str
    state: ReplicaState
    port: int = 0
    unit: str = ""
    message: str = ""
    restarts: int = 0
    slots: int = 0  # requests the engine serves at once (llama.cpp's /props); 0: not known
    # The most tokens one request may hold, prompt and answer (llama.cpp's /props: a slot's
    # n_ctx); 0: not known (an agent older than this field, or an engine that does not say).
    context: int = 0
    # Why it last stopped when it was not asked to: "oom" (killed over its MemoryMax: the
    # next placement uses a larger estimate), "exit" (it ended or crashed); "" none.
    reason: str = ""
    oom_kills: int = 0  # how often the kernel ended it over its memory limit


# Agent -> control plane


class Register(msgspec.Struct, tag="register", frozen=True):
    """First message on a new connection: who the node is and what already runs there."""

    node: str
    address: str  # where engines on this node can be reached by the control plane
    version: str
    inventory: Inventory
    replicas: list[ReplicaStatus] = []
    protocol: int = PROTOCOL
    # The agent takes Upgrade (llmgw upgrade); an older one leaves it out and is upgraded by
    # hand (it would refuse the message it does not know).
    upgrades: bool = False
    # The agent takes Upgrade.from_repositories; an older one would ignore the field and
    # fetch nothing, so the leader halts the roll at it with a why instead.
    repository_upgrades: bool = False


class Heartbeat(msgspec.Struct, tag="heartbeat", frozen=True):
    """Sent every few seconds and on every replica change: the whole current picture."""

    inventory: Inventory
    replicas: list[ReplicaStatus] = []


class Renew(msgspec.Struct, tag="renew", frozen=True):
    """The node's certificate is due: a CSR for the node's own key, sent over the link (the
    connection's certificate says which node asks)."""

    csr_pem: str


class HeldFile(msgspec.Struct, frozen=True):
    """A checked file in the node's cache."""

    sha256: str
    size: int


class Holdings(msgspec.Struct, tag="holdings", frozen=True):
    """The files the node's cache holds, whole: sent after Register on every new connection,
    whenever it changes, and as the answer to a Sweep (naming it)."""

    files: list[HeldFile] = []
    sweep: str = ""  # the id of the Sweep this answers; "" otherwise


UpgradeStep = Literal["waiting", "fetching", "installing", "restarting", "done", "failed"]


class UpgradeReport(msgspec.Struct, tag="upgrade_report", frozen=True):
    """How the node's part of a roll goes (sent as it changes, a fetch's bytes every second):
    "restarting" once the install unit has ended well; the new agent's Register.version says
    it is done. Sent only to a control plane whose Desired says `upgrades`."""

    roll: str  # the Upgrade's roll id
    attempt: int  # the Upgrade's: a report of an earlier try is stale
    step: UpgradeStep
    done_bytes: int = 0  # fetched so far, every package of the node together
    total_bytes: int = 0
    message: str = ""  # a failure's why ("apt-get install exited 100: ..."), else a note


# Control plane -> agent


class Desired(msgspec.Struct, tag="desired", frozen=True):
    """The full set of replicas this node should run; anything else of ours is stopped."""

    replicas: list[ReplicaSpec] = []
    # The control plane takes Renew on this link. An older one leaves it out (False) and
    # would refuse a Renew as not a valid message: the agent asks only where this is True.
    renews: bool = False
    # The control plane takes Holdings and serves the mirror's files to nodes: the agent
    # sends Holdings only where this is True (an older one would refuse the message).
    mirror: bool = False
    # Every control plane's cluster URL (https://HOST:7710): the agent keeps the list and
    # tries the others when its link drops. []: a control plane older than this field.
    control_planes: list[str] = []
    # The node's part in Slurm; None: none (an agent stops the Slurm it started).
    slurm: SlurmPart | None = None
    # The control plane has not loaded its view of Slurm yet (a new leader, until it has
    # read what it kept and heard from the nodes): `slurm` says nothing, and the agent
    # keeps its node's Slurm as it is. An older control plane leaves it out (False).
    slurm_pending: bool = False
    # The control plane takes the replica state "stopping"; an older one would refuse it
    # as not a valid message: the agent says "stopped" there instead.
    stopping: bool = False
    # The control plane takes UpgradeReport; an older one would refuse it.
    upgrades: bool = False


class Refused(msgspec.Struct, tag="refused", frozen=True):
    """The control plane will not take this connection (and says why)."""

    reason: str
    # A standby refuses agents (standby True): the leader's cluster URL, which the agent
    # dials next ("": no leader now: the agent tries the other control planes).
    leader: str = ""
    standby: bool = False


class Renewed(msgspec.Struct, tag="renewed", frozen=True):
    """The node's next certificate, the answer to Renew; the agent uses it from its next
    connection on (the link and the engines go on as they are)."""

    cert_pem: str


class Sweep(msgspec.Struct, tag="sweep", frozen=True):
    """Delete these files from the node's cache (none of its replicas may use them: the agent
    keeps any a replica it runs or fetches uses), then answer with Holdings naming the id."""

    id: str
    remove: list[str] = []  # sha256s
    dry_run: bool = False  # only answer: what would go is what the control plane computed


class UpgradePackage(msgspec.Struct, frozen=True):
    """One staged package (llmgw upgrade stage), fetched from the mirror's files by sha256."""

    kind: Literal["deb", "rpm"]
    name: str  # "llmgw-agentd"
    version: str  # as its package manager says it
    arch: str
    sha256: str
    size: int
    filename: str  # NAME_VERSION_ARCH.deb, NAME-VERSION.ARCH.rpm: what apt-get or dnf is given


class Upgrade(msgspec.Struct, tag="upgrade", frozen=True):
    """Install these packages (those of the node's packaging kind whose names it has
    installed) through a transient unit, then restart on them; answered by UpgradeReports.
    Sent only to an agent whose Register says `upgrades`. The same roll again carries on."""

    roll: str
    attempt: int  # the host's tries in this roll (a resume tries it again)
    release: str  # the llmgw release they carry: the node is done when it reports it
    packages: list[UpgradePackage] = []
    # No staged packages: the node's installed llmgw packages at exactly `release` from its
    # own apt or dnf repositories (sent only to an agent whose Register says
    # `repository_upgrades`; `release` matches REPOSITORY_VERSION_RE).
    from_repositories: bool = False
    # With from_repositories: the version apt-get or dnf is given ("1:0.2.0-1"), where it
    # is more than `release` (what the host says once on it); "": `release` itself.
    version: str = ""


# A version a package manager is given (apt-get PKG=VERSION, dnf PKG-VERSION): digits first,
# so never an option, and nothing a shell or apt's own syntax would read.
REPOSITORY_VERSION_RE = re.compile(
    r"(?:[0-9]{1,9}:)?[0-9][A-Za-z0-9.+~]{0,62}(?:-[A-Za-z0-9.+~]{1,32})?"
)


def repository_version_ok(version: str) -> bool:
    """Whether version may be given to apt-get or dnf as a package's version."""
    return REPOSITORY_VERSION_RE.fullmatch(version) is not None


def release_of(version: str) -> str:
    """The llmgw release a package version carries, as package_version() says it (epoch,
    revision and "~" dropped: 1:0.2.0~rc1-1 -> 0.2.0rc1)."""
    return version.split(":", 1)[-1].split("-", 1)[0].replace("~", "")


AgentMessage = Register | Heartbeat | Renew | Holdings | UpgradeReport
ServerMessage = Desired | Refused | Renewed | Sweep | Upgrade

_agent_decoder = msgspec.json.Decoder(AgentMessage)
_server_decoder = msgspec.json.Decoder(ServerMessage)
encode = msgspec.json.Encoder().encode


def decode_agent(data: bytes | str) -> AgentMessage:
    """Decode a message an agent sent; raises msgspec.ValidationError on anything else."""
    return _agent_decoder.decode(data)


def decode_server(data: bytes | str) -> ServerMessage:
    """Decode a message the control plane sent."""
    return _server_decoder.decode(data)


# Control planes (kept in the store under /servers/NAME, with the control plane's lease)

PlaneRole = Literal["leader", "standby"]


class PlaneInfo(msgspec.Struct, frozen=True):
    """One live control plane, as it tells the others and `llmgw planes` shows it."""

    name: str
    url: str  # its cluster port's URL, as nodes dial it
    role: PlaneRole = "standby"
    term: int = 0  # while leader: its term (the leader key's create revision); else 0
    since: float = 0.0  # unix time it took this role
    version: str = ""  # its llmgwd's release; "": a control plane older than this field
    schema: int = 0  # the store schema it writes (llmgwd.store.schema); 0: older


# Joining (HTTPS on the cluster port, before the node has a certificate)


class JoinRequest(msgspec.Struct, frozen=True):
    """A node asks for its certificate with a join token."""

    token: str
    node: str
    csr_pem: str


class JoinResponse(msgspec.Struct, frozen=True):
    """The node's certificate, signed by the cluster CA, and the CA itself."""

    cert_pem: str
    ca_pem: str


# A control plane joining (`llmgw plane join` -> POST /servers/join on the cluster port, over
# HTTPS pinned to the CA the plane token names, before the host holds any of the cluster's keys)


class EtcdMember(msgspec.Struct, frozen=True):
    """One member of the store's etcd cluster."""

    name: str  # "": added, not started yet (the joining one)
    peer_urls: list[str]


class PlaneJoinRequest(msgspec.Struct, frozen=True):
    """A new control plane asks for its place with a plane token."""

    token: str
    name: str  # its name: the host's, host-name-like; its etcd member's name too
    peer_url: str  # https://ADDRESS:7721, where the other members reach its etcd member


class PlaneJoinResponse(msgspec.Struct, frozen=True):
    """What a control plane needs: the CA and its key, the cluster secret, the members."""

    ca_pem: str
    ca_key_pem: str
    secret: str  # the cluster secret, base64
    members: list[EtcdMember]  # every member, the new one included
    cluster: str  # the cluster's name (server.yaml's name)
