"""The reconciler: the scheduler's placements kept in the store, moved off failed, silent and
drained nodes, and sent to the nodes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from llmgw import engine_memory
from llmgw.wire import Gpu, Inventory, ReplicaSpec, ReplicaState, ReplicaStatus
from llmgwd.catalog import Catalog, Model, engine_key
from llmgwd.placement.estimate import memory_bytes, ram_bytes
from llmgwd.placement.gguf_meta import shape_of
from llmgwd.placement.profiles import Profile
from llmgwd.placement.reconciler import NodeFlags, Reconciler, gpu_fraction
from llmgwd.store.sqlite import SqliteStore

GIB = 1 << 30
SMOL = shape_of(Path(__file__).parent / "gguf" / "smollm2-135m-instruct-q4_1.copied.gguf")
INV = Inventory(cores=4, memory_bytes=16 * GIB, memory_free_bytes=12 * GIB)


@dataclass
class FakeNode:
    name: str
    inventory: Inventory = INV
    replicas: list[ReplicaStatus] = field(default_factory=list)
    connected: bool = True
    silent_s: float = 0.0


class FakeNodes:
    """The cluster state as the reconciler sees it: its nodes, and what each was told."""

    def __init__(self, *names: str) -> None:
        self.by_name = {n: FakeNode(n) for n in names}
        self.desired: dict[str, list[ReplicaSpec]] = {}
        self.gone: set[str] = set()  # removed from the cluster (`llmgw node remove`)

    def nodes(self) -> list[FakeNode]:
        return list(self.by_name.values())

    def set_desired(self, node: str, specs: list[ReplicaSpec]) -> None:
        self.desired[node] = list(specs)

    def removed(self, node: str) -> bool:
        return node in self.gone

    def report(self, state: ReplicaState = "ready", restarts: int = 0) -> None:
        """Every node's agent reports its desired replicas in state."""
        for name, specs in self.desired.items():
            self.by_name[name].replicas = [
                ReplicaStatus(s.id, s.model, state, port=20000, restarts=restarts) for s in specs
            ]

    def where(self, model: str = "m") -> list[str]:
        return sorted(n for n, specs in self.desired.items() for s in specs if s.model == model)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(":memory:")
    yield s
    await s.close()


async def start(
    store: SqliteStore,
    nodes: FakeNodes,
    *models: Model,
    clock: Clock | None = None,
    isolated_cache: bool = False,
) -> Reconciler:
    cat = Catalog(store)
    await cat.load()
    for m in models:
        await cat.add_model(m)
    rec = Reconciler(
        store, cat, nodes, b"s" * 32, grace_s=60, clock=clock or Clock(),
        isolated_cache=isolated_cache,
    )  # fmt: skip
    await rec.load()
    await rec.reconcile()
    return rec


def smol(**kw: object) -> Model:
    return Model(name="m", source="file:/m.gguf", shape=SMOL, **kw)  # type: ignore[arg-type]


async def test_replicas_spread_and_carry_the_context_that_fits(store: SqliteStore) -> None:
    nodes = FakeNodes("a", "b", "c")
    await start(store, nodes, smol(replicas=2))
    assert len(set(nodes.where())) == 2
    spec = next(s for specs in nodes.desired.values() for s in specs)
    assert spec.context == SMOL.context_length and spec.profile == "default"
    assert spec.api_key == engine_key(b"s" * 32, spec.id)


async def test_a_restarted_control_plane_sends_the_same_replicas(store: SqliteStore) -> None:
    nodes = FakeNodes("n1")
    await start(store, nodes, smol(replicas=2))
    sent = nodes.desired["n1"]
    again = FakeNodes()  # no agent has registered with the new llmgwd yet
    await start(store, again)
    assert [s.id for s in again.desired["n1"]] == [s.id for s in sent]


async def test_a_node_removed_just_after_a_restart_loses_its_replicas_at_once(
    store: SqliteStore,
) -> None:
    await start(store, FakeNodes("n1"), smol(replicas=1))
    nodes = FakeNodes("b")  # a restarted llmgwd: n1 has not registered, the grace runs
    rec = await start(store, nodes)
    assert nodes.where() == ["n1"]  # within the grace: kept for n1
    nodes.gone.add("n1")
    await rec.reconcile()
    # Placed elsewhere now, not once the grace ends.
    assert [p.node for p in rec.placements()] == ["b"] and nodes.desired["b"]


async def test_old_records_decode_and_keep_their_engine(store: SqliteStore) -> None:
    # A model and a placement as the single-node slice stored them.
    await store.put("/models/m", b'{"name":"m","source":"file:/m.gguf","replicas":1}')
    await store.put("/placements/m-1", b'{"id":"m-1","model":"m","node":"n1"}')
    nodes = FakeNodes("n1")
    await start(store, nodes)
    [spec] = nodes.desired["n1"]
    assert spec.id == "m-1" and spec.context == 0  # as before: the engine's default
    old = ReplicaSpec(spec.id, "m", "llama.cpp", "file:/m.gguf", api_key=spec.api_key)
    assert spec.fingerprint() == old.fingerprint()  # the running engine is not restarted


async def test_stopping_a_model_empties_its_node(store: SqliteStore) -> None:
    nodes = FakeNodes("n1")
    rec = await start(store, nodes, smol(replicas=1))
    assert len(nodes.desired["n1"]) == 1
    await rec._catalog.update_model("m", replicas=0)
    await rec.reconcile()
    assert nodes.desired["n1"] == []


async def test_a_restart_changes_every_replica_s_fingerprint_where_it_runs(
    store: SqliteStore,
) -> None:
    nodes, clock = FakeNodes("a", "b"), Clock()
    rec = await start(store, nodes, smol(replicas=2), clock=clock)
    nodes.report("starting")  # not serving yet: restarted in place, not replaced beside
    clock.now += 61  # past the grace after start: a roll steps
    before = {s.id: (n, s.fingerprint()) for n, specs in nodes.desired.items() for s in specs}
    await rec._catalog.update_model("m", generation=1)  # POST /models/m/restart
    await rec.reconcile()
    after = {s.id: (n, s.fingerprint()) for n, specs in nodes.desired.items() for s in specs}
    assert len(after) == 2 and after.keys() == before.keys()  # the same replicas, same nodes
    assert all(after[i][0] == before[i][0] and after[i][1] != before[i][1] for i in after)


async def test_a_silent_node_loses_its_replica_and_is_told_so_when_back(
    store: SqliteStore,
) -> None:
    clock = Clock()
    nodes = FakeNodes("a", "b", "c")
    rec = await start(store, nodes, smol(replicas=2), clock=clock)
    lost = nodes.where()[0]
    nodes.report()
    nodes.by_name[lost].connected = False
    nodes.by_name[lost].silent_s = 30
    await rec.reconcile()
    assert lost in nodes.where()  # within the grace period: kept, nothing new
    nodes.by_name[lost].silent_s = 61
    await rec.reconcile()
    assert lost not in nodes.where() and len(nodes.where()) == 2
    assert nodes.desired[lost] == []  # sent when it registers again: its engine is stopped


async def test_a_replica_failing_to_start_moves_to_another_node(store: SqliteStore) -> None:
    nodes = FakeNodes("a", "b")
    rec = await start(store, nodes, smol(replicas=1))
    [first] = nodes.where()
    nodes.report("failed", restarts=3)
    await rec.reconcile()
    [second] = nodes.where()
    assert second != first
    assert [(f.node, f.model) for f in rec.failures()] == [(first, "m")]
    assert await store.get(f"/failures/{first}/m") is not None


async def test_a_failing_replica_with_nowhere_else_to_go_stays(store: SqliteStore) -> None:
    nodes = FakeNodes("a")
    rec = await start(store, nodes, smol(replicas=1))
    [before] = nodes.desired["a"]
    nodes.report("failed", restarts=5)
    await rec.reconcile()
    assert [s.id for s in nodes.desired["a"]] == [before.id]


async def test_a_drained_replica_stops_once_its_replacement_is_ready(store: SqliteStore) -> None:
    nodes = FakeNodes("a", "b")
    rec = await start(store, nodes, smol(replicas=1))
    [old] = nodes.where()
    nodes.report()
    await rec.set_flags(old, NodeFlags(draining=True))
    await rec.reconcile()
    assert sorted(nodes.where()) == ["a", "b"]  # both, until the new one is ready
    nodes.report("starting")
    nodes.by_name[old].replicas = [ReplicaStatus(s.id, "m", "ready") for s in nodes.desired[old]]
    await rec.reconcile()
    assert sorted(nodes.where()) == ["a", "b"]
    nodes.report()
    await rec.reconcile()
    assert nodes.where() != [old] and len(nodes.where()) == 1


async def test_a_new_profile_starts_before_the_old_one_stops(store: SqliteStore) -> None:
    nodes = FakeNodes("a", "b")
    rec = await start(store, nodes, smol(profiles=[Profile(name="p1", kind="cpu", replicas=1)]))
    nodes.report()
    await rec._catalog.update_model(
        "m",
        profiles=[
            Profile(name="p1", kind="cpu", replicas=0),
            Profile(name="p2", kind="cpu", replicas=1, priority=1),
        ],
    )
    await rec.reconcile()
    profiles = sorted(s.profile for specs in nodes.desired.values() for s in specs)
    assert profiles == ["p1", "p2"]
    nodes.report()
    await rec.reconcile()
    [spec] = [s for specs in nodes.desired.values() for s in specs]
    assert spec.profile == "p2" and spec.priority == 1


async def test_an_on_demand_model_wakes_on_a_request_and_parks_when_idle(
    store: SqliteStore,
) -> None:
    clock = Clock()
    nodes = FakeNodes("a")
    rec = await start(store, nodes, smol(replicas=1, on_demand=True, idle_s=60), clock=clock)
    assert nodes.where() == []
    for _ in range(20):
        rec.touch("m")
    await rec.reconcile()
    assert len(nodes.where()) == 1
    clock.now += 59
    await rec.reconcile()
    assert len(nodes.where()) == 1
    clock.now += 2
    await rec.reconcile()
    assert nodes.where() == []


async def test_an_on_demand_model_in_use_stays_awake_over_a_restart(store: SqliteStore) -> None:
    nodes, clock = FakeNodes("a"), Clock()
    rec = await start(store, nodes, smol(replicas=1, on_demand=True, idle_s=60), clock=clock)
    rec.touch("m")
    await rec.reconcile()
    assert len(nodes.where()) == 1
    # llmgwd restarts just after the request: it neither parks the model at once...
    again, clock2 = FakeNodes("a"), Clock()
    rec2 = await start(store, again, clock=clock2)
    assert len(again.where()) == 1
    clock2.now += 59
    await rec2.reconcile()
    assert len(again.where()) == 1
    # ...nor keeps it awake past its idle time.
    clock2.now += 2
    await rec2.reconcile()
    assert again.where() == []


async def test_a_model_without_a_readable_file_is_placed_by_count(store: SqliteStore) -> None:
    nodes = FakeNodes("a")
    m = Model(name="m", source="file:/m.gguf", replicas=2, context=1024)
    rec = await start(store, nodes, m)
    assert [s.context for s in nodes.desired["a"]] == [1024, 1024]
    [(_, verdicts)] = rec.explain(m)
    assert verdicts[0].fits


async def test_cordoned_nodes_take_no_new_replicas_and_flags_persist(store: SqliteStore) -> None:
    nodes = FakeNodes("a", "b")
    rec = await start(store, nodes)
    await rec.set_flags("a", NodeFlags(cordoned=True))
    await rec._catalog.add_model(smol(replicas=1))
    await rec.reconcile()
    assert nodes.where() == ["b"]
    again = await start(store, FakeNodes("a", "b"))
    assert again.flags("a") == NodeFlags(cordoned=True)
    await again.set_flags("a", NodeFlags())
    assert await store.get("/nodeflags/a") is None


def test_the_spec_decodes_from_an_older_agent() -> None:
    old = b'{"id":"r","model":"m","engine":"llama.cpp","source":"file:/m"}'
    spec = msgspec.json.decode(old, type=ReplicaSpec)
    assert spec.devices == [] and spec.priority == 0


async def test_each_replica_gets_a_memory_limit_from_its_estimate(store: SqliteStore) -> None:
    nodes = FakeNodes("a")
    await start(store, nodes, smol(replicas=1))
    [spec] = nodes.desired["a"]
    assert spec.slots == 4  # the node's 16 GiB hold four of its contexts
    ram = memory_bytes(SMOL, spec.context * 4, gpu=False)  # what the scheduler placed it with
    extra = spec.memory_max_bytes - (ram + ram // 4 + (512 << 20))  # a quarter and 512 MiB
    assert 0 <= extra < 1 << 20 and spec.memory_max_bytes % (1 << 20) == 0
    assert spec.memory_max_bytes < 2 * GIB  # SmolLM2: bounded, far below the node's 16 GiB


async def test_a_model_placed_by_count_leaves_the_limit_to_the_node(store: SqliteStore) -> None:
    nodes = FakeNodes("a")
    await start(store, nodes, Model(name="m", source="file:/m.gguf", replicas=1))
    assert [s.memory_max_bytes for s in nodes.desired["a"]] == [0]  # the agent's default
    assert [s.slots for s in nodes.desired["a"]] == [0]  # and the engine's own slots


# Each engine held to its placement: what the spec carries, and OOM kills learnt from


async def test_the_spec_carries_the_placements_cores_and_the_profiles_cache_type(
    store: SqliteStore,
) -> None:
    cpu = Profile(name="cpu", kind="cpu", replicas=1, cores=2, cache_type="q8_0")
    nodes = FakeNodes("a")
    await start(store, nodes, smol(profiles=[cpu], replicas=1))
    (spec,) = nodes.desired["a"]
    assert spec.cores == 2 and spec.cache_type == "q8_0" and spec.gpu_memory_fraction == 0.0


@pytest.mark.parametrize("isolated", [True, False])
async def test_llama_cpp_keeps_no_shared_prompt_cache_when_isolated(
    store: SqliteStore, isolated: bool
) -> None:
    # client.cache_isolation org or key: the agent starts llama-server with --cache-ram 0.
    nodes = FakeNodes("a")
    await start(store, nodes, smol(replicas=1), isolated_cache=isolated)
    (spec,) = nodes.desired["a"]
    assert spec.isolated_cache is isolated


async def test_vllm_on_a_card_is_given_its_share_of_the_card(store: SqliteStore) -> None:
    card = Gpu(
        index=0, uuid="GPU-1", name="H100", memory_total_bytes=80 * GIB,
        memory_free_bytes=80 * GIB, compute_capability="9.0",
    )  # fmt: skip
    inv = msgspec.structs.replace(INV, gpus=[card], cuda_version="13.0")
    nodes = FakeNodes("a")
    nodes.by_name["a"].inventory = inv
    gpu = Profile(name="gpu", kind="gpu", engine="vllm", replicas=1, context=8192)
    model = Model(
        name="m", source="hf:o/r@" + "0" * 40, engine="vllm", shape=SMOL, profiles=[gpu],
        replicas=1,
    )  # fmt: skip
    await start(store, nodes, model)
    (spec,) = nodes.desired["a"]
    held = memory_bytes(SMOL, 8192)  # one context: vLLM's requests share its KV cache
    assert spec.devices == ["GPU-1"] and spec.cores == 0
    assert spec.slots == 0  # no --max-num-seqs of ours: it runs its own
    assert spec.gpu_memory_fraction == -(-held * 100 // (80 * GIB)) / 100  # rounded up
    assert gpu_fraction(41 * GIB, [80 * GIB, 40 * GIB]) == 1.0  # at most the whole card
    assert gpu_fraction(1, [0]) == 0.0  # a card of unknown size: the engine's default


async def test_oom_kills_grow_the_limit_and_a_new_leader_counts_none_twice(
    store: SqliteStore,
) -> None:
    nodes = FakeNodes("a")
    rec = await start(store, nodes, smol(replicas=1))
    (spec,) = nodes.desired["a"]
    first = spec.memory_max_bytes
    oom = ReplicaStatus(spec.id, "m", "ready", port=20000, reason="oom", oom_kills=1)
    nodes.by_name["a"].replicas = [oom]
    await rec.reconcile()
    assert rec.oom_kills("m") == {"default": 1}
    (grown,) = nodes.desired["a"]
    ram = ram_bytes(SMOL, spec.context * spec.slots)
    assert spec.slots == 4 and first == engine_memory.limit(ram)
    assert grown.id == spec.id and grown.memory_max_bytes == engine_memory.limit(int(ram * 1.5))
    # A new leader reads the count from the store, and the same report adds nothing.
    again = FakeNodes("a")
    again.by_name["a"].replicas = [oom]
    leader = await start(store, again)
    assert leader.oom_kills("m") == {"default": 1}
    assert again.desired["a"][0].memory_max_bytes == grown.memory_max_bytes
    again.by_name["a"].replicas = [msgspec.structs.replace(oom, oom_kills=2)]
    await leader.reconcile()
    assert leader.oom_kills("m") == {"default": 2}
    want = engine_memory.limit(int(ram * 2.25))
    assert again.desired["a"][0].memory_max_bytes == want
    (plan,) = leader.explain(leader._catalog.get("m"))  # type: ignore[arg-type]
    assert any("x2.25 after 2 OOM kills" in v.reason for v in plan[1])
