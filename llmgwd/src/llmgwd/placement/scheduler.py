"""The scheduler: replicas placed on nodes and cards (or CPU cores and RAM) where they fit. No I/O.

schedule() takes what is wanted (a Demand per model profile), the nodes as their agents
report them, the placements made before and the (node, model) pairs where a model failed
to start, and answers the placements to add and remove, with, for every profile that
cannot have all its replicas, why not on each node and card (what `llmgw model plan NAME`
prints; explain() gives the same verdicts for any profile).

How a replica is placed:
- where it fits by the estimates (estimate.py): weights + KV cache for its context + a
  margin, on one card or MIG instance (or split over whole cards), or in RAM with its cores;
- a place's memory is the smaller of what NVML (or /proc/meminfo) reports free and its
  size less what placements there reserve: a replica just placed has not allocated yet,
  and a running one shows in the free figure already;
- its whole context first; a shorter one (down to the profile's min_context) only where the
  whole fits nowhere;
- with as many slots (requests at once, each with the whole context) as the KV cache of
  that many contexts fits in the room left beside the weights there, up to
  estimate.MAX_SLOTS, or the slots its args name (llama.cpp's --parallel); the engine is
  given those (ReplicaSpec.slots). vLLM's requests share one paged KV cache: its memory is
  one context's (its --gpu-memory-utilization governs) and its slots its own --max-num-seqs
  (engine_args.own_slots), which it is not given;
- on a node without a replica of the model before one that has one, then on the node with
  fewest replicas, then by name: replicas of one model spread across nodes;
- on the smallest place it fits on (best fit), keeping large cards for large models;
- never where the model failed to start, while anything else fits;
- never on a card below what its engine needs (compute capability, driver:
  llmgw.engine_cards), nor on a node whose agent says it does not run the engine there;
- with a larger estimate after the kernel killed its engines over their memory (OOM kills:
  engine_memory.oom_factor of the RAM it takes, on CPUs; on cards the limit is host RAM, so
  only its MemoryMax grows);
- never on a cordoned or draining node; a draining node's replicas are placed elsewhere and
  its own removed, as are those of nodes no longer known.
"""

from __future__ import annotations

import bisect
import heapq
import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Literal, NamedTuple

import msgspec

from llmgw import engine_args, engine_cards, engine_memory
from llmgw.api_types import Verdict as Verdict  # GET /models/{name}/plan shows them
from llmgw.wire import Inventory
from llmgwd.placement.estimate import (
    CacheType,
    ModelShape,
    context_that_fits,
    cpu_bandwidth,
    cpu_tokens_per_s,
    gib,
    kv_bytes,
    margin_bytes,
    memory_bytes,
    on_card,
    runtime_bytes,
    shard_bytes,
    slots_that_fit,
)
from llmgwd.placement.profiles import Profile, capability

DEFAULT_CONTEXT = 4096  # where neither the profile, the model nor its file gives one


class Node(msgspec.Struct, frozen=True):
    """A node as the scheduler sees it: its last inventory and what an admin said of it."""

    name: str
    inventory: Inventory
    cordoned: bool = False  # takes no new replicas; those there stay
    draining: bool = False  # takes none, and those there are placed elsewhere, then removed


class Demand(msgspec.Struct, frozen=True):
    """One profile of a model: how many replicas, how they run, and the model's shape."""

    model: str
    profile: Profile
    shape: ModelShape
    context: int = 0  # the model's context (Model.context) where the profile gives none
    oom_kills: int = 0  # its engines' OOM kills seen: a larger estimate (engine_memory.oom_factor)


class Started(msgspec.Struct, frozen=True):
    """What of its model's settings a replica was started with (the reconciler's: a replica
    whose settings differ from the model's now is replaced, one at a time)."""

    generation: int = 0  # the model's restart generation
    context: int = 0  # the context wanted (the profile's, else the model's), not the fitted one
    args: list[str] = []  # the profile's engine flags
    cache_type: CacheType | None = None  # the profile's KV cache type


class Placement(msgspec.Struct, frozen=True):
    """Where one replica runs and what it holds there (kept in the store: the first three
    fields are the reconciler's Placement, the others default so old records decode)."""

    id: str
    model: str
    node: str
    profile: str = ""
    devices: list[str] = []  # GPU or MIG UUIDs the replica runs on; [] on CPUs
    context: int = 0  # the context it was given (what fits there)
    memory_bytes: int = 0  # on each device, or in RAM
    cores: int = 0  # CPU cores it was given
    slots: int = 0  # requests it serves at once, each with the context; 0: the engine's own
    started: Started | None = None  # None: a record from before (the model's settings now)


class Removal(msgspec.Struct, frozen=True):
    """A placement to stop, and why."""

    placement: Placement
    reason: str


class Outcome(msgspec.Struct, frozen=True):
    """A profile after the pass: replicas wanted, placed, and why the rest are not."""

    model: str
    profile: str
    wanted: int
    placed: int
    unplaced: int
    refusals: list[Verdict] = []  # every node's and card's verdict, when unplaced > 0


class Plan(msgspec.Struct, frozen=True):
    """One pass's answer."""

    add: list[Placement]
    remove: list[Removal]
    outcomes: list[Outcome]


def replica_id(model: str) -> str:
    """A new replica's id: the model's name and a short random part."""
    return f"{model}-{secrets.token_hex(3)}"


PlaceKind = Literal["card", "mig", "ram"]


class _Place:
    __slots__ = ("avail", "cc", "free", "kind", "label", "models", "reserved", "total", "uuid")

    def __init__(
        self, uuid: str, label: str, kind: PlaceKind, total: int, free: int, cc: tuple[int, int]
    ) -> None:
        self.uuid = uuid
        self.label = label
        self.kind = kind
        self.total = total
        self.free = free
        self.reserved = 0  # by the placements there before this pass
        self.avail = free  # what new replicas may take: settle(), then less each one placed
        self.cc = cc
        self.models: set[str] = set()  # models with a replica here

    def settle(self) -> None:
        self.avail = max(0, min(self.free, self.total - self.reserved))


class _NodeState:
    __slots__ = (
        "bandwidth",
        "cores_free",
        "cores_total",
        "gpu_max",
        "gpus",
        "load",
        "mig_cards",
        "name",
        "node",
        "ram",
    )

    def __init__(self, node: Node) -> None:
        inv = node.inventory
        self.node = node
        self.name = node.name
        self.gpus: list[_Place] = []  # whole cards and MIG instances: the GPU places
        self.mig_cards: list[str] = []  # labels of cards in MIG mode (no places themselves)
        for g in inv.gpus:
            cc = capability(g.compute_capability)
            label = f"card {g.index} ({g.name})"
            if g.mig:
                self.mig_cards.append(label)
                for i in g.instances:
                    self.gpus.append(
                        _Place(
                            i.uuid,
                            f"card {g.index} MIG {i.profile} ({i.uuid})",
                            "mig",
                            i.memory_total_bytes,
                            i.memory_free_bytes,
                            cc,
                        )
                    )
            else:
                self.gpus.append(
                    _Place(g.uuid, label, "card", g.memory_total_bytes, g.memory_free_bytes, cc)
                )
        self.ram = _Place("", "RAM", "ram", inv.memory_bytes, inv.memory_free_bytes, (0, 0))
        self.cores_total = inv.cores
        self.cores_free = inv.cores
        self.bandwidth = (inv.memory_bandwidth_one_core_bytes_s, inv.memory_bandwidth_bytes_s)
        self.load = 0
        self.gpu_max = 0
        self.update()

    def update(self) -> None:
        self.gpu_max = max((p.avail for p in self.gpus), default=0)

    @property
    def open(self) -> bool:
        return not (self.node.cordoned or self.node.draining)


class _Need:
    """A demand's requirements, computed once per pass."""

    __slots__ = (
        "cache",
        "cores",
        "d",
        "factor",
        "fixed",
        "full",
        "full_ctx",
        "gpu",
        "least",
        "min_cc",
        "min_ctx",
        "needs",
        "runtime",
        "shards",
        "shared",
    )

    def __init__(self, d: Demand) -> None:
        p = d.profile
        self.gpu = p.kind == "gpu"
        if self.gpu:  # FreeToken's experts stay in RAM
            d = msgspec.structs.replace(d, shape=on_card(d.shape, p.engine))
        self.d, s = d, d.shape
        self.shards = max(p.gpus, 1) if self.gpu else 1
        self.cache = p.cache_type
        self.cores = p.cores
        self.min_cc = capability(p.min_compute_capability)
        # An OOM kill is over the unit's MemoryMax, host RAM: on CPUs the place's memory grows.
        self.factor = 1.0 if self.gpu else engine_memory.oom_factor(d.oom_kills)
        # On CPUs the engine's own runtime is in the place's memory too (on cards, in RAM).
        self.runtime = 0 if self.gpu else runtime_bytes(p.engine)
        self.needs: dict[str, engine_cards.Needs] = {}  # by the node's CUDA toolkit
        self.full_ctx = p.context or d.context or s.context_length or DEFAULT_CONTEXT
        self.min_ctx = min(p.min_context, self.full_ctx)
        # vLLM's requests share its paged KV cache: one context's, whatever its slots.
        self.shared = p.engine in engine_args.SHARED_KV
        self.fixed = engine_args.slots_named(p.engine, p.args)  # 0: as many as fit
        self.full = self.bytes_at(self.full_ctx, self.kv_slots())
        self.least = self.bytes_at(self.min_ctx, self.kv_slots())

    def kv_slots(self, slots: int = 0) -> int:
        """The contexts whose KV cache a replica with slots (0: the args') holds: one where
        the engine's requests share a paged cache (vLLM)."""
        return 1 if self.shared else (slots or self.fixed or 1)

    def bytes_at(self, ctx: int, slots: int = 1) -> int:
        """Memory on each device (or in RAM) at a context, for slots requests of it at once."""
        s, tokens = self.d.shape, ctx * slots
        if self.shards > 1:
            return shard_bytes(s, tokens, self.cache, self.shards)
        mem = memory_bytes(s, tokens, self.cache, gpu=self.gpu)
        return int((mem + self.runtime) * self.factor)

    def _room(self, avail: int) -> int:
        return int(avail / self.factor) - self.runtime

    def context_in(self, avail: int) -> int:
        """The longest context that fits in avail on each device (limited to the wanted)."""
        return context_that_fits(
            self.d.shape,
            self._room(avail),
            self.cache,
            self.gpu,
            self.full_ctx,
            self.shards,
            self.kv_slots(),
        )

    def slots_in(self, avail: int, ctx: int) -> int:
        """Requests of ctx tokens a replica serves at once in avail on each device: the
        args' own number, else as many as fit (estimate.slots_that_fit); vLLM's own
        --max-num-seqs where it shares one KV cache over them."""
        if self.shared:
            p = self.d.profile
            return engine_args.own_slots(p.engine, p.args)
        if self.fixed:
            return self.fixed
        s = self.d.shape
        return slots_that_fit(s, self._room(avail), ctx, self.cache, self.gpu, self.shards)

    def fit(self, places: list[_Place], avail: int, ctx: int) -> _Fit:
        """A replica of ctx tokens on places (avail on each): its slots and memory there."""
        slots = self.slots_in(avail, ctx)
        return _Fit(places, ctx, self.bytes_at(ctx, self.kv_slots(slots)), slots)

    def needs_on(self, inv: Inventory) -> engine_cards.Needs:
        """What the profile's engine asks of a node's cards and driver."""
        got = self.needs.get(inv.cuda_toolkit)
        if got is None:
            p = self.d.profile
            got = engine_cards.needs(p.engine, p.engine_version, inv.cuda_toolkit)
            self.needs[inv.cuda_toolkit] = got
        return got

    def card_ok(self, inv: Inventory, place: _Place) -> bool:
        """A card (or MIG instance) of the node that the engine and the profile accept."""
        return place.cc >= self.min_cc and place.cc >= self.needs_on(inv).compute_capability

    def breakdown(self, ctx: int) -> str:
        s = self.d.shape
        w = s.weights_bytes // self.shards
        kv = kv_bytes(s, ctx * self.kv_slots(), self.cache) // self.shards
        m = margin_bytes(s, self.gpu, self.shards)
        return f"weights {gib(w)} + KV {gib(kv)} + margin {gib(m)}"


class _Fit(NamedTuple):
    places: list[_Place]
    context: int
    bytes: int
    slots: int


class _Cluster:
    """The pass's working state: every node's places with what is left on them."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.nodes = {n.name: _NodeState(n) for n in nodes}
        # By node and UUID: a UUID is the card's own, but a node is what a placement names.
        self.by_uuid = {(ns.name, p.uuid): p for ns in self.nodes.values() for p in ns.gpus}
        self.mine: dict[str, Counter[str]] = {}
        self.buckets: dict[int, list[str]] = {}

    def reserve(self, p: Placement, need: _Need | None) -> None:
        """Count a placement made before: its node's load and the memory it holds."""
        ns = self.nodes[p.node]
        ns.load += 1
        self.mine.setdefault(p.model, Counter())[p.node] += 1
        held = p.memory_bytes
        if not held and need is not None:  # a record from before memory was kept
            held = need.bytes_at(p.context or need.full_ctx)
        if p.devices:
            for uuid in p.devices:
                place = self.by_uuid.get((p.node, uuid))
                if place is not None:
                    place.reserved += held
                    place.models.add(p.model)
        else:
            ns.ram.reserved += held
            ns.cores_free -= p.cores or ns.cores_total

    def settle(self) -> None:
        """After every earlier placement is counted: what each place has left."""
        for ns in self.nodes.values():
            for place in ns.gpus:
                place.settle()
            ns.ram.settle()
            ns.cores_free = max(ns.cores_free, 0)
            ns.update()

    def index(self) -> None:
        """Open nodes by load, then name: the order new replicas try them in."""
        self.buckets = {}
        for name in sorted(self.nodes):
            ns = self.nodes[name]
            if ns.open:
                self.buckets.setdefault(ns.load, []).append(name)

    def fresh(self, skip: set[str]) -> Iterator[_NodeState]:
        for load in sorted(self.buckets):
            for name in self.buckets[load]:
                if name not in skip:
                    yield self.nodes[name]

    def moved(self, loads_before: dict[str, int]) -> None:
        for name, before in loads_before.items():
            ns = self.nodes[name]
            if ns.load == before:
                continue
            bucket = self.buckets[before]
            del bucket[bisect.bisect_left(bucket, name)]
            if not bucket:
                del self.buckets[before]
            bisect.insort(self.buckets.setdefault(ns.load, []), name)


def _cpu_cores(need: _Need, ns: _NodeState) -> int:
    return need.cores or ns.cores_total


def _fit(need: _Need, ns: _NodeState, reduced: bool) -> _Fit | None:
    """The best place on a node for one replica: its whole context (or, reduced, the longest
    down to min_context), or None where it does not fit."""
    floor = need.least if reduced else need.full
    if _engine_refusal(need, ns.node.inventory):
        return None
    if not need.gpu:
        cores = _cpu_cores(need, ns)
        if ns.cores_free < cores or ns.ram.avail < floor:
            return None
        if not reduced:
            return need.fit([ns.ram], ns.ram.avail, need.full_ctx)
        ctx = need.context_in(ns.ram.avail)
        return need.fit([ns.ram], ns.ram.avail, ctx) if ctx >= need.min_ctx else None
    if ns.gpu_max < floor:
        return None
    inv = ns.node.inventory
    ok = [
        p
        for p in ns.gpus
        if p.avail >= floor and need.card_ok(inv, p) and (need.shards == 1 or p.kind == "card")
    ]
    if len(ok) < need.shards:
        return None
    # A card without a replica of the model first (replicas spread over a node's cards too),
    # then best fit: the smallest that holds it; reduced, the largest: the longest context.
    model = need.d.model
    if not reduced:
        ok.sort(key=lambda p: (model in p.models, p.avail, p.label))
        chosen = ok[: need.shards]
        return need.fit(chosen, min(p.avail for p in chosen), need.full_ctx)
    ok.sort(key=lambda p: (model in p.models, -p.avail, p.label))
    chosen = ok[: need.shards]
    avail = min(p.avail for p in chosen)
    ctx = need.context_in(avail)
    return need.fit(chosen, avail, ctx) if ctx >= need.min_ctx else None


def _engine_refusal(need: _Need, inv: Inventory) -> str:
    """Why a node cannot run the profile's engine at all ("" when it can): its agent says it
    does not run it there (an agent that says nothing runs llama.cpp, as before), or its
    driver is older than the engine's CUDA."""
    engine = need.d.profile.engine
    kind = "gpu" if need.gpu else "cpu"
    if inv.engines and f"{engine}:{kind}" not in inv.engines:
        where = "on cards" if need.gpu else "on CPUs"
        toolkit = " (no CUDA toolkit)" if need.gpu and not inv.cuda_toolkit else ""
        return f"its agent does not run {engine} {where}{toolkit}"
    if not need.gpu or not inv.gpus:
        return ""
    needs = need.needs_on(inv)
    return engine_cards.driver_refusal(needs, inv.cuda_version, inv.gpu_driver_version)


def _commit(cl: _Cluster, need: _Need, ns: _NodeState, fit: _Fit, new_id: str) -> Placement:
    for p in fit.places:
        p.avail -= fit.bytes
        p.models.add(need.d.model)
    cores = 0
    if not need.gpu:
        cores = _cpu_cores(need, ns)
        ns.cores_free -= cores
    ns.load += 1
    ns.update()
    model = need.d.model
    cl.mine.setdefault(model, Counter())[ns.name] += 1
    return Placement(
        id=new_id,
        model=model,
        node=ns.name,
        profile=need.d.profile.name,
        devices=[p.uuid for p in fit.places if p.kind != "ram"],
        context=fit.context,
        memory_bytes=fit.bytes,
        cores=cores,
        slots=fit.slots,
    )


def _place(
    cl: _Cluster, need: _Need, count: int, failed: set[str], new_id: Callable[[str], str]
) -> list[Placement]:
    """Up to count new replicas of one demand, in the order the module's docstring gives."""
    model = need.d.model
    mine = cl.mine.setdefault(model, Counter())
    loads: dict[str, int] = {}
    out: list[Placement] = []
    for reduced, on_failed in ((False, False), (True, False), (False, True), (True, True)):
        if len(out) >= count:
            break
        if on_failed:
            fresh: Iterator[_NodeState] = iter(())
            names = [n for n in failed if n in cl.nodes]
        else:
            fresh = cl.fresh(failed | {n for n, c in mine.items() if c})
            names = [n for n, c in mine.items() if c and n not in failed and n in cl.nodes]
        heap = [(mine[n], cl.nodes[n].load, n) for n in names if cl.nodes[n].open]
        heapq.heapify(heap)
        while len(out) < count:
            chosen: tuple[_NodeState, _Fit] | None = None
            for ns in fresh:
                fit = _fit(need, ns, reduced)
                if fit is not None:
                    chosen = (ns, fit)
                    break
            while chosen is None and heap:
                ns = cl.nodes[heapq.heappop(heap)[2]]
                fit = _fit(need, ns, reduced)
                if fit is not None:
                    chosen = (ns, fit)
            if chosen is None:
                break
            ns, fit = chosen
            loads.setdefault(ns.name, ns.load)
            out.append(_commit(cl, need, ns, fit, new_id(model)))
            heapq.heappush(heap, (mine[ns.name], ns.load, ns.name))
    cl.moved(loads)
    return out


def _surplus(cl: _Cluster, have: list[Placement], extra: int, failed: set[str]) -> list[Placement]:
    """Which extra placements go: those on cordoned nodes or where the model failed first,
    then from the nodes with most replicas of the model (the rest stay spread)."""
    counts = Counter(p.node for p in have)

    def key(p: Placement) -> tuple[bool, bool, int, int, str]:
        ns = cl.nodes[p.node]
        return (not ns.node.cordoned, p.node not in failed, -counts[p.node], -ns.load, p.id)

    out: list[Placement] = []
    for _ in range(extra):
        p = min((p for p in have if p not in out), key=key)
        counts[p.node] -= 1
        out.append(p)
    return out


def _cluster(
    nodes: Iterable[Node], placements: list[Placement], needs: dict[tuple[str, str], _Need]
) -> tuple[_Cluster, list[Removal], dict[tuple[str, str], list[Placement]]]:
    cl = _Cluster(nodes)
    demands = [n.d for n in needs.values()]
    models = {d.model for d in demands}
    remove: list[Removal] = []
    kept: dict[tuple[str, str], list[Placement]] = {k: [] for k in needs}
    for p in placements:
        ns = cl.nodes.get(p.node)
        key = (p.model, p.profile)
        if ns is not None:
            cl.reserve(p, needs.get(key))  # running until stopped: it holds its memory
        if p.model not in models:
            remove.append(Removal(p, "the model is no longer in the catalog"))
        elif key not in needs:
            remove.append(Removal(p, f"the model has no profile {p.profile!r} any more"))
        elif ns is None:
            remove.append(Removal(p, f"node {p.node} is gone"))
        elif ns.node.draining:
            remove.append(Removal(p, f"node {p.node} is draining"))
        else:
            kept[key].append(p)
    cl.settle()
    return cl, remove, kept


def schedule(
    demands: list[Demand],
    nodes: list[Node],
    placements: list[Placement],
    failures: Iterable[tuple[str, str]] = (),
    new_id: Callable[[str], str] = replica_id,
) -> Plan:
    """One placement pass: the replicas to add and remove so each profile has its count.

    failures: (node, model) pairs where the model failed to start. Larger models are placed
    first (they fit in fewer places); removals of a draining or gone node's replicas are
    listed with their reason, and the caller stops them once their replacements are ready.
    """
    needs = {(d.model, d.profile.name): _Need(d) for d in demands}
    cl, remove, kept = _cluster(nodes, placements, needs)
    cl.index()
    failed: dict[str, set[str]] = {}
    for node, model in failures:
        failed.setdefault(model, set()).add(node)
    # The largest first: best fit packs better that way.
    order = sorted(needs.items(), key=lambda kv: (-kv[1].least, kv[0]))
    add: list[Placement] = []
    outcomes: list[Outcome] = []
    for key, need in order:
        d = need.d
        have = kept[key]
        wanted = max(d.profile.replicas, 0)
        new: list[Placement] = []
        if len(have) > wanted:
            for p in _surplus(cl, have, len(have) - wanted, failed.get(d.model, set())):
                remove.append(Removal(p, "more replicas than the profile wants"))
            placed = wanted
        else:
            new = _place(cl, need, wanted - len(have), failed.get(d.model, set()), new_id)
            add.extend(new)
            placed = len(have) + len(new)
        refusals = [] if placed >= wanted else _verdicts(cl, need, failed.get(d.model, set()))
        outcomes.append(Outcome(d.model, d.profile.name, wanted, placed, wanted - placed, refusals))
    outcomes.sort(key=lambda o: (o.model, o.profile))
    return Plan(add=add, remove=remove, outcomes=outcomes)


def explain(
    demand: Demand,
    nodes: list[Node],
    placements: list[Placement],
    failures: Iterable[tuple[str, str]] = (),
) -> list[Verdict]:
    """For one more replica of demand: whether it fits on each node and card, with the
    context and memory it would have there, or why not (for `llmgw model plan NAME`)."""
    need = _Need(demand)
    cl, _, _ = _cluster(nodes, placements, {(demand.model, demand.profile.name): need})
    failed = {n for n, m in failures if m == demand.model}
    return _verdicts(cl, need, failed)


def _verdicts(cl: _Cluster, need: _Need, failed: set[str]) -> list[Verdict]:
    out: list[Verdict] = []
    for name in sorted(cl.nodes):
        out.extend(_node_verdicts(need, cl.nodes[name], name in failed))
    return out


def _node_verdicts(need: _Need, ns: _NodeState, failed: bool) -> list[Verdict]:
    name = ns.name
    if ns.node.draining:
        return [Verdict(name, "", False, reason="draining: its replicas are moving away")]
    if ns.node.cordoned:
        return [Verdict(name, "", False, reason="cordoned: it takes no new replicas")]
    note = "; the model failed to start here before (used only when nothing else fits)"
    note = note if failed else ""
    refusal = _engine_refusal(need, ns.node.inventory)
    if refusal:
        return [Verdict(name, "", False, reason=refusal)]
    if not need.gpu:
        return [_cpu_verdict(need, ns, note)]
    out = [
        Verdict(name, label, False, reason="in MIG mode: only its MIG instances are places")
        for label in ns.mig_cards
    ]
    if not ns.gpus and not ns.mig_cards:
        return [Verdict(name, "", False, reason="no GPU")]
    whole = [p for p in ns.gpus if p.kind == "card"]
    needs = need.needs_on(ns.node.inventory)
    for p in ns.gpus:
        below = engine_cards.card_refusal(needs, f"{p.cc[0]}.{p.cc[1]}")
        if below:
            out.append(Verdict(name, p.label, False, reason=below))
        elif p.cc < need.min_cc:
            cc = f"{p.cc[0]}.{p.cc[1]}"
            want = f"{need.min_cc[0]}.{need.min_cc[1]}"
            out.append(
                Verdict(name, p.label, False, reason=f"compute capability {cc} is below {want}")
            )
        elif need.shards > 1 and p.kind == "mig":
            out.append(
                Verdict(
                    name,
                    p.label,
                    False,
                    reason=f"a MIG instance cannot join other cards ({need.shards} per replica)",
                )
            )
        elif need.shards == 1:
            out.append(_memory_verdict(need, name, p, note))
    if need.shards > 1:
        out.append(_shards_verdict(need, ns, whole, note))
    return out


def _memory_verdict(need: _Need, node: str, p: _Place, note: str) -> Verdict:
    ctx = need.context_in(p.avail) if p.avail >= need.least else 0
    if ctx >= need.min_ctx:
        fit = need.fit([p], p.avail, ctx)
        return _fitting(node, p.label, fit, reason=_fits(need, ctx) + note)
    return Verdict(node, p.label, False, reason=_short(need, p.avail, p.total))


def _shards_verdict(need: _Need, ns: _NodeState, whole: list[_Place], note: str) -> Verdict:
    n = need.shards
    label = f"{n} cards"
    ok = sorted(
        (p for p in whole if need.card_ok(ns.node.inventory, p) and p.avail >= need.least),
        key=lambda p: -p.avail,
    )
    if len(ok) >= n:
        ctx = need.context_in(ok[n - 1].avail)
        if ctx >= need.min_ctx:
            fit = need.fit(ok[:n], ok[n - 1].avail, ctx)
            return _fitting(ns.name, label, fit, reason=_fits(need, ctx) + note)
    return Verdict(
        ns.name,
        label,
        False,
        reason=f"{len(ok)} of {len(whole)} whole cards hold a share of {gib(need.least)} "
        f"at the least ({need.min_ctx} tokens: {need.breakdown(need.min_ctx)}); {n} are needed",
    )


def _cpu_verdict(need: _Need, ns: _NodeState, note: str) -> Verdict:
    cores = _cpu_cores(need, ns)
    if ns.cores_free < cores:
        return Verdict(
            ns.name,
            "cores",
            False,
            reason=f"{ns.cores_free} of {ns.cores_total} cores free, {cores} needed",
        )
    ram = ns.ram
    ctx = need.context_in(ram.avail) if ram.avail >= need.least else 0
    if ctx < need.min_ctx:
        return Verdict(ns.name, "RAM", False, reason=_short(need, ram.avail, ram.total))
    one, every = ns.bandwidth
    bw = cpu_bandwidth(one, every, cores, ns.cores_total)
    tps = cpu_tokens_per_s(need.d.shape, bw, cores) if bw else 0.0
    speed = f", about {tps:.0f} tokens/s on {cores} cores" if bw else ""
    fit = need.fit([ram], ram.avail, ctx)
    return _fitting(ns.name, "RAM", fit, tps, _fits(need, ctx) + speed + note)


def _fitting(node: str, place: str, fit: _Fit, tps: float = 0.0, reason: str = "") -> Verdict:
    """A place where one more replica fits, with its context, memory and slots there."""
    return Verdict(node, place, True, fit.context, fit.bytes, tps, reason, fit.slots)


def _fits(need: _Need, ctx: int) -> str:
    grown = ""
    if need.factor > 1:
        n = need.d.oom_kills
        kills = "an OOM kill" if n == 1 else f"{n} OOM kills"
        grown = f" (the estimate x{need.factor:g} after {kills} of its engines)"
    if ctx < need.full_ctx:
        return f"fits with {ctx} of the {need.full_ctx} tokens wanted{grown}"
    return f"fits with all {ctx} tokens{grown}"


def _short(need: _Need, avail: int, total: int) -> str:
    each = " on each card" if need.shards > 1 else ""
    return (
        f"{gib(avail)} free of {gib(total)}; needs {gib(need.least)}{each} at the least "
        f"({need.min_ctx} tokens: {need.breakdown(need.min_ctx)})"
    )
