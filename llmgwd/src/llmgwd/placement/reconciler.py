"""The leader's reconciler: the scheduler's placements kept in the store, and each node's set."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from llmgw import engine_args, engine_memory
from llmgw.wire import Inventory, ReplicaSpec, ReplicaStatus
from llmgwd.catalog import Catalog, Model, engine_key, profiles_of
from llmgwd.placement import rolling, scheduler
from llmgwd.placement.estimate import ModelShape, ram_bytes
from llmgwd.placement.profiles import DEFAULT, Profile
from llmgwd.placement.rolling import Rollout
from llmgwd.placement.scheduler import Demand, Placement, Removal, Started, Verdict
from llmgwd.store import Store, prefix_end

log = logging.getLogger(__name__)

PLACEMENTS = "/placements/"
FAILURES = "/failures/"  # /failures/NODE/MODEL: where a model failed to start
NODE_FLAGS = "/nodeflags/"  # /nodeflags/NODE: cordoned, draining
LAST_USED = "/lastused/"  # /lastused/MODEL: an on-demand model's last request, so a restart
# of llmgwd neither parks a model in use nor wakes a parked one
ROLLOUTS = "/rollouts/"  # /rollouts/MODEL: its replicas' roll to new settings (rolling.py)
OOM_KILLS = "/oomkills/"  # /oomkills/MODEL: its engines' OOM kills, so a new leader places it
# with the same larger estimate (and counts no kill twice)

FAILED_RESTARTS = 3  # a failed replica restarted this often has failed to start there
FAILED_FOR_S = 30.0  # or one failed for this long
FAILURE_TTL_S = 3600.0  # a failure is forgotten after this: the node may have been mended
REPLACE_TIMEOUT_S = 120.0  # the longest a removal waits for its replacement to be ready
ROLL_READY_TIMEOUT_S = 900.0  # a roll's replacement not ready after this has failed to start

# A model whose file llmgwd cannot read: placed by count only (no weights, no KV cache, any
# context: the engine's own default is what it gets).
UNKNOWN_SHAPE = ModelShape(
    format="gguf",
    architecture="unknown",
    weights_bytes=0,
    context_length=1 << 24,
    layers=0,
    head_count=0,
    kv_heads=0,
    key_length=0,
    value_length=0,
)
_NO_INVENTORY = Inventory(cores=0, memory_bytes=0, memory_free_bytes=0)

__all__ = ["Placement", "Reconciler"]


class NodeFlags(msgspec.Struct, frozen=True):
    """What an admin said of a node (`llmgw node cordon|drain|uncordon`)."""

    cordoned: bool = False
    draining: bool = False


class Failure(msgspec.Struct, frozen=True):
    """A model that failed to start on a node, and when."""

    node: str
    model: str
    at: float  # unix time
    message: str = ""


class OomKills(msgspec.Struct, frozen=True):
    """How often the kernel killed a model's engines over their MemoryMax, by profile, and
    each live replica's count already taken in (ReplicaStatus.oom_kills)."""

    profiles: dict[str, int] = {}
    seen: dict[str, int] = {}  # replica id -> its oom_kills counted
    at: float = 0.0  # unix time of the last one


class LastUsed(msgspec.Struct, frozen=True):
    """When an on-demand model last had a request."""

    at: float  # unix time


class NodeView(Protocol):
    """One node as the cluster state reports it (cluster.NodeInfo)."""

    @property
    def name(self) -> str: ...
    @property
    def inventory(self) -> Inventory: ...
    @property
    def replicas(self) -> Sequence[ReplicaStatus]: ...
    @property
    def connected(self) -> bool: ...
    @property
    def silent_s(self) -> float: ...


class Nodes(Protocol):
    """What the reconciler needs of the cluster state."""

    def nodes(self) -> Sequence[NodeView]:
        """Every node that registered since start (connected or not)."""
        ...

    def set_desired(self, node: str, specs: list[ReplicaSpec]) -> None:
        """Tell a node the full set of replicas it should run."""
        ...

    def removed(self, node: str) -> bool:
        """Whether node was removed from the cluster (`llmgw node remove`) since start."""
        ...


_dec = msgspec.json.Decoder(Placement)
_flags_dec = msgspec.json.Decoder(NodeFlags)
_failure_dec = msgspec.json.Decoder(Failure)
_used_dec = msgspec.json.Decoder(LastUsed)
_oom_dec = msgspec.json.Decoder(OomKills)
_roll_dec = msgspec.json.Decoder(Rollout)
_enc = msgspec.json.Encoder()


@dataclass
class Roll:
    """One pass's view for the rolls: replica states, the nodes to place on, live failures,
    and the stale replicas standing beside their replacements (the scheduler counts none)."""

    status: dict[str, ReplicaStatus]
    nodes: list[scheduler.Node]
    live: set[tuple[str, str]]
    outgoing: set[str] = field(default_factory=set)


def demands(model: Model, awake: bool = True, ooms: OomKills | None = None) -> list[Demand]:
    """What the scheduler is asked for a model: one Demand per profile (none wanted while
    an on-demand model is parked), each with its engines' OOM kills (a larger estimate)."""
    shape = model.shape or UNKNOWN_SHAPE
    kills = ooms.profiles if ooms is not None else {}
    out = []
    for p in profiles_of(model):
        if not awake:
            p = msgspec.structs.replace(p, replicas=0)
        out.append(Demand(model.name, p, shape, model.context, kills.get(p.name, 0)))
    return out


def profile_named(model: Model, name: str) -> Profile | None:
    """A model's profile by name (an old placement without one runs the default)."""
    name = name or DEFAULT
    return next((p for p in profiles_of(model) if p.name == name), None)


def _key(*parts: str) -> str:
    return "/".join(parts)


class Reconciler:
    """Runs the scheduler whenever the catalog or the cluster changes, and pushes Desired sets.

    Removals wait for their replacements: a replica is stopped once the model has as many
    other replicas ready as it wants, or after REPLACE_TIMEOUT_S; one whose node is gone,
    whose model is gone, or that failed where it runs is removed at once. Replicas started
    with older settings than their model's are replaced one at a time (rolling.py).
    """

    def __init__(
        self,
        store: Store,
        catalog: Catalog,
        nodes: Nodes,
        secret: bytes,
        *,
        grace_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        isolated_cache: bool = False,  # client.cache_isolation is not none: see ReplicaSpec
    ) -> None:
        self._isolated_cache = isolated_cache
        self._store = store
        self._catalog = catalog
        self._nodes = nodes
        self._secret = secret
        self._grace_s = grace_s
        self._clock = clock
        self._started = clock()
        self._wake = asyncio.Event()
        self.passes, self.pass_s = 0, 0.0  # passes run and their seconds, for /metrics
        self._placements: dict[str, Placement] = {}
        self._flags: dict[str, NodeFlags] = {}
        self._held: dict[str, NodeFlags] = {}  # nodes Slurm holds (slurm/lending.py), not kept
        self._failures: dict[tuple[str, str], Failure] = {}
        self._failing_since: dict[str, float] = {}  # replica id -> first seen failed
        self._unready_since: dict[str, float] = {}  # roll's replacement -> first seen not ready
        self._leaving_since: dict[str, float] = {}  # replica id -> its removal first planned
        self._last_used: dict[str, float] = {}  # on-demand model -> its last request
        self._used_saved: dict[str, float] = {}  # what the store holds of _last_used
        self._ooms: dict[str, OomKills] = {}  # model -> its engines' OOM kills
        self._rolls: dict[str, Rollout] = {}  # model -> its roll to new settings
        self._room: dict[str, bool] = {}  # model -> whether its last roll step fit beside
        # (model, profile) -> its count before a stale replica was stopped for a replacement
        # not placed yet, and when
        self._placing: dict[tuple[str, str], tuple[int, float]] = {}
        self.outcomes: list[scheduler.Outcome] = []  # the last pass's, for people

    def poke(self) -> None:
        """Something changed: reconcile soon (many pokes make one pass)."""
        self._wake.set()

    async def run(self, period_s: float = 5.0) -> None:
        """Reconcile on every poke and every period (which catches grace periods ending and
        idle models), for ever."""
        await self.load()
        while True:
            self._wake.clear()
            began = time.perf_counter()
            try:
                await self.reconcile()
            except Exception:
                log.exception("reconcile pass failed; trying again")
            self.passes, self.pass_s = self.passes + 1, self.pass_s + time.perf_counter() - began
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), period_s)

    async def load(self) -> None:
        """Read placements, node flags and failures from the store."""
        kvs, _ = await self._store.range(PLACEMENTS, prefix_end(PLACEMENTS))
        for kv in kvs:
            p = _dec.decode(kv.value)
            self._placements[p.id] = p if p.profile else msgspec.structs.replace(p, profile=DEFAULT)
        kvs, _ = await self._store.range(NODE_FLAGS, prefix_end(NODE_FLAGS))
        self._flags = {kv.key[len(NODE_FLAGS) :]: _flags_dec.decode(kv.value) for kv in kvs}
        kvs, _ = await self._store.range(FAILURES, prefix_end(FAILURES))
        for f in (_failure_dec.decode(kv.value) for kv in kvs):
            self._failures[(f.node, f.model)] = f
        kvs, _ = await self._store.range(OOM_KILLS, prefix_end(OOM_KILLS))
        self._ooms = {kv.key[len(OOM_KILLS) :]: _oom_dec.decode(kv.value) for kv in kvs}
        kvs, _ = await self._store.range(ROLLOUTS, prefix_end(ROLLOUTS))
        self._rolls = {kv.key[len(ROLLOUTS) :]: _roll_dec.decode(kv.value) for kv in kvs}
        for name, rec in self._rolls.items():  # a replacement for a stopped one, still awaited
            for profile, count in rec.stopped.items():
                self._placing[(name, profile)] = (count, self._clock())
        kvs, _ = await self._store.range(LAST_USED, prefix_end(LAST_USED))
        for kv in kvs:
            ago = max(0.0, time.time() - _used_dec.decode(kv.value).at)
            name = kv.key[len(LAST_USED) :]
            self._last_used[name] = self._used_saved[name] = self._clock() - ago

    # On-demand models

    def awake(self, model: Model) -> bool:
        """Whether a model's replicas are wanted now: always, unless it is on demand and has
        had no request for its idle time."""
        if not model.on_demand:
            return True
        used = self._last_used.get(model.name)
        return used is not None and self._clock() - used < model.idle_s

    def touch(self, name: str) -> None:
        """A request for model name arrived: an on-demand model wakes (or stays awake)."""
        model = self._catalog.get(name)
        if model is None or not model.on_demand:
            return
        was_awake = self.awake(model)
        self._last_used[name] = self._clock()
        if not was_awake:
            log.info("model %s woken by a request", name, extra={"model": name})
            self.poke()

    async def _save_last_used(self) -> None:
        """Store what changed of the last requests (once a pass, not once a request)."""
        for name, used in list(self._last_used.items()):
            if self._catalog.get(name) is None:
                await self._store.delete(LAST_USED + name)
                del self._last_used[name]
                self._used_saved.pop(name, None)
            elif self._used_saved.get(name) != used:
                at = time.time() - (self._clock() - used)
                await self._store.put(LAST_USED + name, _enc.encode(LastUsed(at)))
                self._used_saved[name] = used

    # Node flags

    def flags(self, node: str) -> NodeFlags:
        """What an admin said of node."""
        return self._flags.get(node, NodeFlags())

    async def set_flags(self, node: str, flags: NodeFlags) -> None:
        """Cordon, drain or uncordon a node (kept in the store), and reconcile."""
        if flags == NodeFlags():
            await self._store.delete(NODE_FLAGS + node)
            self._flags.pop(node, None)
        else:
            await self._store.put(NODE_FLAGS + node, _enc.encode(flags))
            self._flags[node] = flags
        self.poke()

    def hold(self, held: Mapping[str, NodeFlags]) -> None:
        """The nodes Slurm holds from the scheduler now (lent ones draining, taken-back ones
        cordoned), apart from what an admin said of them; reconcile if that changed."""
        if dict(held) != self._held:
            self._held = dict(held)
            self.poke()

    # One pass

    async def reconcile(self) -> None:
        """One pass: note failures, schedule, store the changes, send every node its set."""
        models = self._catalog.all()
        await self._save_last_used()
        infos = {n.name: n for n in self._nodes.nodes()}
        status = {r.id: r for n in infos.values() if n.connected for r in n.replicas}
        await self._note_failures(status)
        await self._note_ooms(status, models)
        wanted = {m.name: demands(m, self.awake(m), self._ooms.get(m.name)) for m in models}
        live = set(self._live_failures())
        nodes = self._scheduler_nodes(infos)
        await self._stamp_old(models)
        roll = Roll(status, nodes, live)
        await self._roll(models, wanted, roll)
        failed_here = {
            p.id
            for p in self._placements.values()
            if (p.node, p.model) in live and getattr(status.get(p.id), "state", "") == "failed"
        }
        left = failed_here | roll.outgoing
        kept = [p for p in self._placements.values() if p.id not in left]
        plan = scheduler.schedule([d for ds in wanted.values() for d in ds], nodes, kept, live)
        self.outcomes = plan.outcomes
        add, moved = self._moves(plan.add, failed_here)
        by_name = {m.name: m for m in models}
        for p in add:
            await self._put(self._stamped(p, by_name[p.model]))
        for p, reason in moved:
            await self._delete(p, reason)
        for r in self._due(plan.remove, status, wanted):
            await self._delete(r.placement, r.reason)
        self.push(models)

    def _scheduler_nodes(self, infos: dict[str, NodeView]) -> list[scheduler.Node]:
        """The nodes to place on: those heard from within the grace period (only connected
        ones take new replicas), and those with placements that have not registered since
        llmgwd started, until the grace period from the start ends (not a removed one: its
        replicas are placed elsewhere at once)."""
        out: list[scheduler.Node] = []
        for name, n in infos.items():
            if not n.connected and n.silent_s > self._grace_s:
                continue  # gone: its replicas are placed elsewhere
            f, h = self.flags(name), self._held.get(name, NodeFlags())
            cordoned = f.cordoned or h.cordoned or not n.connected
            out.append(scheduler.Node(name, n.inventory, cordoned, f.draining or h.draining))
        if self._clock() - self._started <= self._grace_s:
            for name in sorted({p.node for p in self._placements.values()} - set(infos)):
                if self._nodes.removed(name):
                    continue
                out.append(scheduler.Node(name, _NO_INVENTORY, cordoned=True))
        return out

    def _live_failures(self) -> list[tuple[str, str]]:
        now = time.time()
        return [k for k, f in self._failures.items() if now - f.at < FAILURE_TTL_S]

    async def _note_failures(self, status: dict[str, ReplicaStatus]) -> None:
        """Remember (node, model) where a replica keeps failing: restarted FAILED_RESTARTS
        times, or failed for FAILED_FOR_S."""
        now = self._clock()
        for p in self._placements.values():
            st = status.get(p.id)
            if st is None or st.state != "failed":
                self._failing_since.pop(p.id, None)
                continue
            since = self._failing_since.setdefault(p.id, now)
            key = (p.node, p.model)
            fresh = key in self._live_failures()
            if fresh or (st.restarts < FAILED_RESTARTS and now - since < FAILED_FOR_S):
                continue
            f = Failure(p.node, p.model, time.time(), st.message)
            await self._store.put(_key(FAILURES.rstrip("/"), p.node, p.model), _enc.encode(f))
            self._failures[key] = f
            log.warning(
                "model %s failed to start on node %s (%s); placing it elsewhere where it fits",
                p.model,
                p.node,
                st.message,
                extra={"model": p.model, "node": p.node, "replica": p.id},
            )

    async def _note_ooms(self, status: dict[str, ReplicaStatus], models: list[Model]) -> None:
        """Count each replica's new OOM kills into its model's record (kept in the store): the
        next placements and memory limits of that profile use a larger estimate."""
        names = {m.name for m in models}
        for name in [n for n in self._ooms if n not in names]:  # a model removed: forgotten
            await self._store.delete(OOM_KILLS + name)
            del self._ooms[name]
        changed: dict[str, OomKills] = {}
        for p in self._placements.values():
            st = status.get(p.id)
            rec = changed.get(p.model) or self._ooms.get(p.model, OomKills())
            if st is None or p.model not in names or st.oom_kills == rec.seen.get(p.id, 0):
                continue
            new = max(st.oom_kills - rec.seen.get(p.id, 0), 0)  # fewer: its agent began anew
            kills = dict(rec.profiles)
            if new:
                kills[p.profile] = kills.get(p.profile, 0) + new
                log.warning(
                    "replica %s of %s was killed over its memory limit; %s's next placements"
                    " and limits use an estimate x%g",
                    p.id, p.model, p.profile, engine_memory.oom_factor(kills[p.profile]),
                    extra={"model": p.model, "replica": p.id, "node": p.node},
                )  # fmt: skip
            at = time.time() if new else rec.at
            changed[p.model] = OomKills(kills, {**rec.seen, p.id: st.oom_kills}, at)
        for name, rec in changed.items():
            live = {rid: n for rid, n in rec.seen.items() if rid in self._placements}
            rec = msgspec.structs.replace(rec, seen=live)
            await self._store.put(OOM_KILLS + name, _enc.encode(rec))
            self._ooms[name] = rec

    def oom_kills(self, model: str) -> dict[str, int]:
        """A model's engines' OOM kills by profile (what its estimate grew by)."""
        rec = self._ooms.get(model)
        return dict(rec.profiles) if rec is not None else {}

    def _moves(
        self, add: list[Placement], failed_here: set[str]
    ) -> tuple[list[Placement], list[tuple[Placement, str]]]:
        """A failed replica is moved where its replacement went to another node; where the
        scheduler found no other place, the failed one stays (its agent keeps trying)."""
        add = list(add)
        moved: list[tuple[Placement, str]] = []
        for rid in sorted(failed_here):
            p = self._placements[rid]
            same = [a for a in add if (a.model, a.profile) == (p.model, p.profile)]
            elsewhere = [a for a in same if a.node != p.node]
            if elsewhere:
                moved.append((p, f"it failed to start there; moved to {elsewhere[0].node}"))
                continue
            for a in same[:1]:  # it would have been placed where it failed: keep the old one
                add.remove(a)
        return add, moved

    def _due(
        self,
        removals: Iterable[Removal],
        status: dict[str, ReplicaStatus],
        wanted: dict[str, list[Demand]],
    ) -> list[Removal]:
        """The removals to make now: at once where the replica cannot serve or the model is
        gone; else once the model's other replicas are ready, or REPLACE_TIMEOUT_S passed."""
        now = self._clock()
        planned = {r.placement.id for r in removals}
        for rid in list(self._leaving_since):
            if rid not in planned:
                del self._leaving_since[rid]
        out: list[Removal] = []
        for r in removals:
            p = r.placement
            since = self._leaving_since.setdefault(p.id, now)
            want = sum(max(d.profile.replicas, 0) for d in wanted.get(p.model, []))
            ready = sum(
                1
                for q in self._placements.values()
                if q.model == p.model
                and q.id not in planned
                and getattr(status.get(q.id), "state", "") == "ready"
            )
            at_once = p.model not in wanted or " is gone" in r.reason or want == 0
            if at_once or ready >= want or now - since >= REPLACE_TIMEOUT_S:
                out.append(r)
        return out

    async def _keep(self, p: Placement) -> None:
        await self._store.put(PLACEMENTS + p.id, _enc.encode(p))
        self._placements[p.id] = p

    async def _put(self, p: Placement) -> None:
        await self._keep(p)
        log.info(
            "replica %s of %s (profile %s) placed on %s",
            p.id,
            p.model,
            p.profile,
            p.node,
            extra={"model": p.model, "replica": p.id, "node": p.node},
        )

    async def _delete(self, p: Placement, reason: str) -> None:
        await self._store.delete(PLACEMENTS + p.id)
        self._placements.pop(p.id, None)
        self._leaving_since.pop(p.id, None)
        self._failing_since.pop(p.id, None)
        self._unready_since.pop(p.id, None)
        log.info(
            "replica %s of %s removed from %s: %s",
            p.id,
            p.model,
            p.node,
            reason,
            extra={"model": p.model, "replica": p.id, "node": p.node},
        )

    def push(self, models: list[Model]) -> None:
        """Send each known node the specs of the replicas placed on it."""
        by_name = {m.name: m for m in models}
        nodes = self._nodes.nodes()
        per_node: dict[str, list[ReplicaSpec]] = {n.name: [] for n in nodes}
        sizes = _place_sizes(nodes)
        for p in sorted(self._placements.values(), key=lambda p: p.id):
            m = by_name.get(p.model)
            profile = profile_named(m, p.profile) if m is not None else None
            if m is not None and profile is not None:
                spec = self.spec(p, m, profile, sizes.get(p.node, {}))
                per_node.setdefault(p.node, []).append(spec)
        for node, specs in per_node.items():
            self._nodes.set_desired(node, specs)

    def spec(
        self, p: Placement, m: Model, profile: Profile, sizes: dict[str, int] | None = None
    ) -> ReplicaSpec:
        """What the node needs to run replica p of model m: the context the scheduler found
        room for and a memory limit from its estimate (where the model's shape is known; else
        the node's default limit; larger after OOM kills), its cards and the share of each
        it may fill (vLLM's; sizes: the node's cards' memory by UUID), its cores and the
        profile's KV cache type, and the slots the scheduler found room for."""
        st = p.started or rolling.settings(m, profile)  # what its engine runs (rolling.py)
        context = (p.context if m.shape is not None else 0) or st.context
        # vLLM's slots share its KV cache: it runs its own --max-num-seqs (none given here)
        sized = m.shape is not None and p.context and m.engine not in engine_args.SHARED_KV
        slots = p.slots if sized else 0
        memory_max = 0
        if m.shape is not None:
            tokens = (context or m.shape.context_length) * (slots or 1)
            gpu = profile.kind == "gpu"
            ram = ram_bytes(m.shape, tokens, st.cache_type, gpu=gpu, engine=m.engine)
            grown = engine_memory.oom_factor(self.oom_kills(m.name).get(profile.name, 0))
            memory_max = engine_memory.limit(int(ram * grown))
        fraction = 0.0
        if m.engine == "vllm" and p.devices and p.memory_bytes:
            fraction = gpu_fraction(p.memory_bytes, [(sizes or {}).get(d, 0) for d in p.devices])
        return ReplicaSpec(
            id=p.id,
            model=m.name,
            engine=m.engine,
            source=m.source,
            args=list(st.args),
            context=context,
            api_key=engine_key(self._secret, p.id),
            devices=list(p.devices),
            profile=profile.name,
            priority=profile.priority,
            memory_max_bytes=memory_max,
            files=list(m.files),
            cores=p.cores,
            gpu_memory_fraction=fraction,
            cache_type=st.cache_type or "",
            isolated_cache=self._isolated_cache and m.engine in ("llama.cpp", "freetoken"),
            generation=st.generation,
            slots=slots,
        )

    # Rolling replacement (rolling.py)

    async def _stamp_old(self, models: list[Model]) -> None:
        """Give a placement stored before Placement.started its model's settings now: its
        spec carried them, so its engine runs them."""
        by_name = {m.name: m for m in models}
        for p in [p for p in self._placements.values() if p.started is None]:
            m = by_name.get(p.model)
            if m is not None and profile_named(m, p.profile) is not None:
                await self._keep(self._stamped(p, m))

    def _stamped(self, p: Placement, m: Model) -> Placement:
        """p with the settings a new replica of its profile starts with: the model's now,
        or, while its roll is halted, what its old replicas run."""
        profile = profile_named(m, p.profile)
        if profile is None:
            return p
        now = rolling.settings(m, profile)
        rec = self._rolls.get(m.name)
        if rec is not None and rec.halted and rec.target == rolling.targets(m):
            now = rec.old.get(profile.name, now)
        return msgspec.structs.replace(p, started=now)

    async def _save_roll(self, name: str, rec: Rollout | None) -> None:
        if rec is None:
            await self._store.delete(ROLLOUTS + name)
            self._rolls.pop(name, None)
            self._room.pop(name, None)
            for key in [k for k in self._placing if k[0] == name]:
                del self._placing[key]
        else:
            await self._store.put(ROLLOUTS + name, _enc.encode(rec))
            self._rolls[name] = rec

    async def _roll(self, models: list[Model], wanted: dict[str, list[Demand]], roll: Roll) -> None:
        """One step of each awake model's roll to its new settings, per profile (a halted
        roll waits for new settings). Within the grace after start nothing steps: the nodes
        may not have reported their replicas yet."""
        if self._clock() - self._started < self._grace_s:
            self._hold_rolls(models, wanted, roll)
            return
        names = {m.name for m in models}
        for name in [n for n in self._rolls if n not in names]:
            await self._save_roll(name, None)
        for m in models:
            target, rec = rolling.targets(m), self._rolls.get(m.name)
            if not self.awake(m) or (rec is not None and rec.target == target and rec.halted):
                continue
            steps = [(d, self._step(m, d, roll)) for d in wanted[m.name]]
            if all(s.action == "done" for _, s in steps):
                if rec is not None:
                    await self._save_roll(m.name, None)
                    log.info("model %s: every replica runs its new settings", m.name)
                continue
            if rec is None or rec.target != target:
                await self._save_roll(m.name, Rollout(target, self._old_settings(m, target)))
                log.info("model %s: replacing its replicas for new settings", m.name)
            busy = any(s.action in ("wait", "retire") for _, s in steps)
            for d, s in steps:
                if s.action == "surge" and busy:
                    continue  # one profile at a time: the model has one replica down at most
                await self._take(m, d, s, roll)
                busy = busy or s.action == "surge"

    def _hold_rolls(self, models: list[Model], wanted: dict[str, list[Demand]], roll: Roll) -> None:
        """Within the grace: a stale replica standing beside its replacement stays (the
        scheduler counts it out), and no roll steps."""
        for m in models:
            for d in wanted[m.name]:
                s = self._step(m, d, roll)
                if s.outgoing is not None:
                    roll.outgoing.add(s.outgoing.id)

    def _old_settings(self, m: Model, target: dict[str, Started]) -> dict[str, Started]:
        """By profile: the settings of a replica of m that runs older ones than target."""
        out: dict[str, Started] = {}
        for p in sorted(self._placements.values(), key=lambda p: p.id):
            if p.model != m.name or p.started is None or p.profile not in target:
                continue
            if p.started != target[p.profile]:
                out.setdefault(p.profile, p.started)
        return out

    def _step(self, m: Model, d: Demand, roll: Roll) -> rolling.Step:
        """rolling.step for d's profile; placing: a stale one was stopped for a replacement
        not placed yet (up to REPLACE_TIMEOUT_S); replacing: that replacement, placed, is
        not ready yet."""
        key, now = (m.name, d.profile.name), rolling.settings(m, d.profile)
        mine = [p for p in self._placements.values() if (p.model, p.profile) == key]

        def state(rid: str) -> str:
            return getattr(roll.status.get(rid), "state", "")

        count, since = self._placing.get(key, (0, 0.0))
        placing = len(mine) < count and self._clock() - since < REPLACE_TIMEOUT_S
        replacing = key in self._placing and len(mine) >= count
        replacing = replacing and any(state(p.id) != "ready" for p in mine if p.started == now)
        if not (placing or replacing):
            self._placing.pop(key, None)
        return rolling.step(
            max(d.profile.replicas, 0),
            mine,
            now,
            state,
            lambda rid: self._failing(roll.status.get(rid)) or self._stuck(rid, state(rid)),
            placing,
            replacing,
        )

    def _failing(self, st: ReplicaStatus | None) -> bool:
        """Whether a replica failed to start, as _note_failures counts it."""
        if st is None or st.state != "failed":
            return False
        since = self._failing_since.get(st.id, self._clock())
        return st.restarts >= FAILED_RESTARTS or self._clock() - since >= FAILED_FOR_S

    def _stuck(self, rid: str, state: str) -> bool:
        """Whether a roll's replacement has not been ready for ROLL_READY_TIMEOUT_S (stuck
        starting, or its node silent): it counts as failed to start."""
        if state == "ready":
            self._unready_since.pop(rid, None)
            return False
        since = self._unready_since.setdefault(rid, self._clock())
        return self._clock() - since >= ROLL_READY_TIMEOUT_S

    async def _take(self, m: Model, d: Demand, s: rolling.Step, roll: Roll) -> None:
        """Make one step of a profile's roll (rolling.step's)."""
        now = rolling.settings(m, d.profile)
        if s.action == "wait" and s.outgoing is not None:
            roll.outgoing.add(s.outgoing.id)
        elif s.action == "restart":
            for p in s.replicas:
                await self._restart(p, now)
        elif s.action == "retire":
            await self._delete(s.replicas[0], "replaced by one with the model's new settings")
        elif s.action == "halt":
            await self._halt(m, s.replicas[0], roll)
        elif s.action == "surge":
            new = self._surge(d, roll)
            self._room[m.name] = new is not None
            if new is not None:
                await self._put(msgspec.structs.replace(new, started=now))
                roll.outgoing.add(s.replicas[0].id)
            else:
                await self._replace(m, d, s.replicas[0], roll)

    async def _replace(self, m: Model, d: Demand, old: Placement, roll: Roll) -> None:
        """No room beside: old stops and its replacement is placed in this pass, before any
        other model's demand can take the room it leaves."""
        key = (m.name, d.profile.name)
        have = sum(1 for p in self._placements.values() if (p.model, p.profile) == key)
        self._placing[key] = (have, self._clock())
        rec = self._rolls.get(m.name)
        if rec is not None:
            stopped = {**rec.stopped, d.profile.name: have}
            await self._save_roll(m.name, msgspec.structs.replace(rec, stopped=stopped))
        why = "stopped for its replacement with the new settings (no room beside it)"
        await self._delete(old, why)
        new = self._surge(d, roll)
        if new is not None:
            await self._put(msgspec.structs.replace(new, started=rolling.settings(m, d.profile)))

    async def _restart(self, p: Placement, now: Started) -> None:
        """A stale replica that serves nothing: started again with now, in place (placed
        again where its memory changes with them)."""
        if p.started is not None and rolling.needs_place(p.started, now):
            await self._delete(p, "placed again for the model's new settings (it was not ready)")
            return
        self._unready_since.pop(p.id, None)
        await self._keep(msgspec.structs.replace(p, started=now))
        log.info(
            "replica %s of %s started again on %s with the model's new settings",
            p.id, p.model, p.node,
            extra={"model": p.model, "replica": p.id, "node": p.node},
        )  # fmt: skip

    def _surge(self, d: Demand, roll: Roll) -> Placement | None:
        """One more replica of d's profile beside those placed, where placement has room."""
        key = (d.model, d.profile.name)
        have = sum(1 for p in self._placements.values() if (p.model, p.profile) == key)
        more = msgspec.structs.replace(d.profile, replicas=have + 1)
        placed = list(self._placements.values())
        plan = scheduler.schedule(
            [msgspec.structs.replace(d, profile=more)], roll.nodes, placed, roll.live
        )
        return plan.add[0] if plan.add else None

    async def _halt(self, m: Model, p: Placement, roll: Roll) -> None:
        """A replica of the new settings failed to start: it goes, the old ones stay, and
        the roll waits for new settings."""
        st = roll.status.get(p.id)
        why = st.message if st is not None and st.message else "no reason given"
        if st is None or st.state != "failed":
            state = st.state if st is not None else "not reported by its node"
            why = f"not ready after {ROLL_READY_TIMEOUT_S / 60:g} minutes: {state}"
        back = any(k[0] == m.name for k in self._placing)  # it replaced an old one stopped
        text = (
            f"halted: replica {p.id} failed to start with the new settings on {p.node} ({why});"
            " the replicas run the old settings"
            + (" (the old one stopped for it is placed again with them)" if back else "")
            + " until the model is restarted or its context changed again"
        )
        await self._delete(p, "it failed to start with the model's new settings: the roll stops")
        for key in [k for k in self._placing if k[0] == m.name]:
            del self._placing[key]
        rec = self._rolls.get(m.name)
        if rec is not None:
            await self._save_roll(m.name, msgspec.structs.replace(rec, halted=text))
        log.warning("model %s: roll %s", m.name, text, extra={"model": m.name, "replica": p.id})

    def rollout(self, model: Model) -> str:
        """Model's replicas' roll to its new settings as people read it: how many are left
        and how, or why it halted ("" when none runs)."""
        target = rolling.targets(model)
        rec = self._rolls.get(model.name)
        if rec is not None and rec.halted and rec.target == target:
            return rec.halted
        stale = [
            p
            for p in self._placements.values()
            if p.model == model.name and p.started is not None and p.profile in target
            and p.started != target[p.profile]
        ]  # fmt: skip
        if not stale:
            return ""
        want = sum(max(p.replicas, 0) for p in profiles_of(model))
        room = self._room.get(model.name)
        if room is None:
            room = any(v.fits for _, verdicts in self.explain(model) for v in verdicts)
        return rolling.note(len(stale), want, room)

    # Views

    def placements(self) -> list[Placement]:
        """Where every replica is, now."""
        return list(self._placements.values())

    def failures(self) -> list[Failure]:
        """Where models failed to start (and are not placed again while anything else fits)."""
        return [self._failures[k] for k in sorted(self._failures)]

    def explain(self, model: Model) -> list[tuple[Profile, list[Verdict]]]:
        """For each profile of model: where one more replica would go, or why not, per node
        and card (`llmgw model plan`)."""
        infos = {n.name: n for n in self._nodes.nodes()}
        nodes = self._scheduler_nodes(infos)
        placements = self.placements()
        failures = self._live_failures()
        return [
            (d.profile, scheduler.explain(d, nodes, placements, failures))
            for d in demands(model, ooms=self._ooms.get(model.name))
        ]


def _place_sizes(nodes: Sequence[NodeView]) -> dict[str, dict[str, int]]:
    """Each node's cards and MIG instances: their memory by UUID."""
    out: dict[str, dict[str, int]] = {}
    for n in nodes:
        sizes = out.setdefault(n.name, {})
        for g in n.inventory.gpus:
            sizes[g.uuid] = g.memory_total_bytes
            for i in g.instances:
                sizes[i.uuid] = i.memory_total_bytes
    return out


def gpu_fraction(memory_bytes: int, sizes: list[int]) -> float:
    """The share of each card a replica holding memory_bytes on each may fill (vLLM's
    --gpu-memory-utilization), rounded up to a hundredth; 0.0 where a card's size is not known
    (the engine's default)."""
    if not sizes or min(sizes) <= 0:
        return 0.0
    share = -(-memory_bytes * 100 // min(sizes)) / 100
    return min(share, 1.0)
