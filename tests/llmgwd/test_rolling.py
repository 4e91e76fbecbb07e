"""A restart or a context change replaces a model's replicas one at a time: never fewer
ready than wanted (a new one beside an old one where it fits) or wanted less one (where
none fits), to the end, and a new replica that fails halts the roll with the old ones kept."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from llmgw.wire import Inventory, ReplicaSpec, ReplicaState, ReplicaStatus
from llmgwd.catalog import Model
from llmgwd.placement.profiles import Profile
from llmgwd.placement.reconciler import Reconciler
from llmgwd.placement.rolling import needs_place
from llmgwd.placement.scheduler import Started
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.test_reconciler import GIB, SMOL, Clock, FakeNodes, smol, start

ONE_CORE = Inventory(cores=1, memory_bytes=16 * GIB, memory_free_bytes=12 * GIB)
GRACE_S = 60  # the reconciler's in test_reconciler.start


class Agents:
    """Every node's agent: a replica new or with a changed spec is starting for one round,
    then ready (or failed, where fails says so of its spec); one no longer wanted is gone."""

    def __init__(self, nodes: FakeNodes, fails: Callable[[ReplicaSpec], bool]) -> None:
        self.nodes = nodes
        self.fails = fails
        self.stuck: Callable[[ReplicaSpec], bool] = lambda s: False  # starting for ever
        self.running: dict[str, tuple[str, ReplicaState]] = {}  # id -> (fingerprint, state)

    def round(self) -> None:
        seen: dict[str, tuple[str, ReplicaState]] = {}
        for name, specs in self.nodes.desired.items():
            statuses = []
            for s in specs:
                fp, state = self.running.get(s.id, ("", "starting"))
                if fp != s.fingerprint():
                    state = "starting"
                elif state == "starting" and not self.stuck(s):
                    state = "failed" if self.fails(s) else "ready"
                seen[s.id] = (s.fingerprint(), state)
                restarts = 3 if state == "failed" else 0
                statuses.append(ReplicaStatus(s.id, s.model, state, 20000, restarts=restarts))
            self.nodes.by_name[name].replicas = statuses
        self.running = seen

    def ready(self) -> int:
        return sum(state == "ready" for _, state in self.running.values())

    def generations(self) -> list[int]:
        return sorted(s.generation for specs in self.nodes.desired.values() for s in specs)


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(":memory:")
    yield s
    await s.close()


async def settled(
    store: SqliteStore,
    nodes: FakeNodes,
    model: Model,
    fails: Callable[[ReplicaSpec], bool] = lambda s: False,
) -> tuple[Reconciler, Agents]:
    """A reconciler past its grace after start, and agents with model's replicas all ready."""
    clock = Clock()
    rec = await start(store, nodes, model, clock=clock)
    agents = Agents(nodes, fails)
    for _ in range(3):
        agents.round()
        await rec.reconcile()
    assert agents.ready() == model.replicas
    clock.now += GRACE_S + 1  # every node has reported since: rolls may step
    return rec, agents


async def roll(rec: Reconciler, agents: Agents, rounds: int = 20) -> list[int]:
    """Passes and agent rounds until nothing changes: the ready count after each round."""
    out: list[int] = []
    for _ in range(rounds):
        await rec.reconcile()
        agents.round()
        out.append(agents.ready())
    return out


async def test_a_restart_with_room_keeps_every_replica_ready(store: SqliteStore) -> None:
    nodes = FakeNodes("a", "b", "c")
    rec, agents = await settled(store, nodes, smol(replicas=2))
    before = {p.id for p in rec.placements()}
    model = await rec._catalog.update_model("m", generation=1)  # POST /models/m/restart
    assert "one at a time" in rec.rollout(model) and "beside" in rec.rollout(model)
    readies = await roll(rec, agents)
    assert min(readies) == 2  # never one fewer
    assert agents.generations() == [1, 1] and agents.ready() == 2
    assert not before & {p.id for p in rec.placements()}  # each one replaced
    assert rec.rollout(model) == "" and await store.get("/rollouts/m") is None


async def test_a_restart_without_room_has_at_most_one_replica_down(store: SqliteStore) -> None:
    nodes = FakeNodes("a", "b")
    for n in nodes.by_name.values():
        n.inventory = ONE_CORE  # a replica takes its node's one core: none fits beside
    rec, agents = await settled(store, nodes, smol(replicas=2))
    model = await rec._catalog.update_model("m", generation=1)
    assert "no room for one more" in rec.rollout(model)
    readies = await roll(rec, agents)
    assert min(readies) == 1 and readies[-1] == 2
    assert agents.generations() == [1, 1]


async def test_one_replica_and_no_room_restarts_in_place(store: SqliteStore) -> None:
    nodes = FakeNodes("a")
    nodes.by_name["a"].inventory = ONE_CORE
    rec, agents = await settled(store, nodes, smol(replicas=1))
    model = await rec._catalog.update_model("m", generation=1)
    assert "restarts in place" in rec.rollout(model)
    readies = await roll(rec, agents)
    assert 0 in readies and readies[-1] == 1
    assert agents.generations() == [1] and nodes.where() == ["a"]


async def test_a_context_change_rolls_the_replicas_to_it(store: SqliteStore) -> None:
    nodes = FakeNodes("a", "b", "c")
    rec, agents = await settled(store, nodes, smol(replicas=2))
    assert {s.context for s in nodes.desired["a"] + nodes.desired["b"]} == {8192}
    await rec._catalog.update_model("m", context=2048)  # PUT /models/m/context
    readies = await roll(rec, agents)
    assert min(readies) == 2
    contexts = [s.context for specs in nodes.desired.values() for s in specs]
    assert contexts == [2048, 2048]


async def test_a_new_replica_that_fails_halts_the_roll_and_keeps_the_old(
    store: SqliteStore,
) -> None:
    nodes = FakeNodes("a", "b", "c")
    rec, agents = await settled(store, nodes, smol(replicas=2), fails=lambda s: s.generation == 1)
    old = sorted(p.id for p in rec.placements())
    model = await rec._catalog.update_model("m", generation=1)
    readies = await roll(rec, agents)
    assert min(readies) == 2
    assert sorted(p.id for p in rec.placements()) == old and agents.generations() == [0, 0]
    assert rec.rollout(model).startswith("halted: replica m-")
    assert "failed to start" in rec.rollout(model)
    # Settings changed again (a restart after the cause is mended): it rolls on.
    agents.fails = lambda s: False
    await rec._catalog.update_model("m", generation=2)
    readies = await roll(rec, agents)
    assert min(readies) == 2 and agents.generations() == [2, 2]


async def test_a_failed_replacement_without_room_comes_back_on_the_old_settings(
    store: SqliteStore,
) -> None:
    nodes = FakeNodes("a", "b")
    for n in nodes.by_name.values():
        n.inventory = ONE_CORE
    rec, agents = await settled(store, nodes, smol(replicas=2), fails=lambda s: s.generation == 1)
    model = await rec._catalog.update_model("m", generation=1)
    readies = await roll(rec, agents)
    assert min(readies) == 1 and readies[-1] == 2  # the stopped one's room runs the old again
    assert agents.generations() == [0, 0]
    assert rec.rollout(model).startswith("halted:")


async def test_a_replacement_never_ready_halts_the_roll_in_the_end(store: SqliteStore) -> None:
    nodes = FakeNodes("a")
    nodes.by_name["a"].inventory = ONE_CORE  # restarts in place: m is down while it starts
    rec, agents = await settled(store, nodes, smol(replicas=1))
    agents.stuck = lambda s: s.generation == 1  # neither ready nor failed
    model = await rec._catalog.update_model("m", generation=1)
    clock = rec._clock
    assert isinstance(clock, Clock)
    for _ in range(40):  # 40 passes a minute apart
        await rec.reconcile()
        agents.round()
        clock.now += 60
    assert agents.ready() == 1 and agents.generations() == [0]  # the old settings back
    assert rec.rollout(model).startswith("halted: replica m-")
    assert "not ready after 15 minutes: starting" in rec.rollout(model)


def test_new_flags_naming_other_slots_place_a_replica_anew_as_a_context_does() -> None:
    now = Started(context=4096, args=["--temp", "0.2"])
    assert not needs_place(now, Started(context=4096, args=["--temp", "0.7"]))
    assert needs_place(now, Started(context=2048, args=["--temp", "0.2"]))
    # its memory holds a context per slot: two slots named where it had its own
    assert needs_place(now, Started(context=4096, args=["--temp", "0.2", "-np", "2"]))
    assert needs_place(now, Started(context=4096, args=["--max-num-seqs", "8"]))


async def test_a_profile_short_of_room_rolls_the_replicas_it_has(store: SqliteStore) -> None:
    nodes = FakeNodes("a", "b")
    for n in nodes.by_name.values():
        n.inventory = ONE_CORE
    clock = Clock()
    rec = await start(store, nodes, smol(replicas=3), clock=clock)  # room for 2 of 3
    agents = Agents(nodes, lambda s: False)
    await roll(rec, agents, rounds=3)
    clock.now += GRACE_S + 1
    assert agents.ready() == 2
    await rec._catalog.update_model("m", generation=1)
    readies = await roll(rec, agents)
    assert min(readies) == 1 and readies[-1] == 2
    assert agents.generations() == [1, 1]


async def test_profiles_roll_one_at_a_time(store: SqliteStore) -> None:
    nodes = FakeNodes("a")
    nodes.by_name["a"].inventory = Inventory(
        cores=3, memory_bytes=16 * GIB, memory_free_bytes=12 * GIB
    )
    profiles = [Profile(name=f"p{n}", kind="cpu", replicas=1, cores=n) for n in (1, 2)]
    rec, agents = await settled(store, nodes, smol(profiles=profiles, replicas=2))  # 3 cores
    await rec._catalog.update_model("m", generation=1)
    readies = await roll(rec, agents)
    assert min(readies) == 1 and readies[-1] == 2  # never both profiles' replicas down
    assert agents.generations() == [1, 1]


async def test_a_roll_waits_for_nodes_it_does_not_hear_from(store: SqliteStore) -> None:
    nodes = FakeNodes("a", "b", "c")
    rec, agents = await settled(store, nodes, smol(replicas=3))
    old = {p.id for p in rec.placements()}
    await rec._catalog.update_model("m", context=2048)
    await rec.reconcile()  # the first new one placed beside
    for n in nodes.by_name.values():  # every node drops for a moment: nothing is known
        n.connected, n.silent_s = False, 5.0
    await rec.reconcile()
    assert old <= {p.id for p in rec.placements()}  # the old ones are not stopped unseen
    for n in nodes.by_name.values():
        n.connected, n.silent_s = True, 0.0
    readies = await roll(rec, agents, rounds=30)
    assert min(readies) == 3 and readies[-1] == 3
    assert [s.context for specs in nodes.desired.values() for s in specs] == [2048] * 3


async def test_a_new_leader_mid_roll_waits_to_hear_from_the_nodes(store: SqliteStore) -> None:
    names = ("a", "b", "c", "d")
    rec, agents = await settled(store, FakeNodes(*names), smol(replicas=4))
    await rec._catalog.update_model("m", generation=1)
    await rec.reconcile()  # the first new one placed beside
    agents.round()
    # llmgwd restarts (or another control plane leads): its nodes connect, not reported yet
    agents.nodes = again = FakeNodes(*names)
    clock = Clock()
    rec2 = Reconciler(store, rec._catalog, again, b"s" * 32, grace_s=GRACE_S, clock=clock)
    await rec2.load()
    readies = []
    for n in range(50):
        await rec2.reconcile()
        agents.round()
        readies.append(agents.ready())
        if n * 5 < GRACE_S:  # within its grace after start: no step, the one new one stays
            assert agents.generations() == [0, 0, 0, 0, 1]
        clock.now += 5
    assert min(readies) >= 4 and readies[-1] == 4  # never fewer than wanted
    assert agents.generations() == [1, 1, 1, 1]


async def test_one_replica_without_room_failing_anew_comes_back_on_the_old_settings(
    store: SqliteStore,
) -> None:
    nodes = FakeNodes("a")
    nodes.by_name["a"].inventory = ONE_CORE
    rec, agents = await settled(store, nodes, smol(replicas=1), fails=lambda s: s.generation == 1)
    model = await rec._catalog.update_model("m", generation=1)
    readies = await roll(rec, agents, rounds=30)
    assert 0 in readies and readies[-1] == 1  # down while it tried, then up again
    assert agents.generations() == [0]
    assert rec.rollout(model).startswith("halted:") and "old settings" in rec.rollout(model)


async def test_a_new_leader_brings_back_the_old_settings_too(store: SqliteStore) -> None:
    nodes = FakeNodes("a")
    nodes.by_name["a"].inventory = ONE_CORE
    rec, agents = await settled(store, nodes, smol(replicas=1), fails=lambda s: s.generation == 1)
    model = await rec._catalog.update_model("m", generation=1)
    await rec.reconcile()  # the old one stopped for its replacement
    agents.round()
    clock = Clock()  # llmgwd restarts before the replacement is ready
    rec2 = Reconciler(store, rec._catalog, nodes, b"s" * 32, grace_s=GRACE_S, clock=clock)
    await rec2.load()
    for _ in range(30):
        await rec2.reconcile()
        agents.round()
        clock.now += 5
    assert agents.ready() == 1 and agents.generations() == [0]
    assert rec2.rollout(model).startswith("halted:")


async def test_the_room_an_old_replica_leaves_goes_to_its_replacement(
    store: SqliteStore,
) -> None:
    nodes = FakeNodes("n1", "n2", "n3")
    for n in nodes.by_name.values():
        n.inventory = ONE_CORE
    rec, agents = await settled(store, nodes, smol(replicas=3))
    waiting = Model(name="a", source="file:/a.gguf", shape=SMOL, replicas=1)
    await rec._catalog.add_model(waiting)  # no room for it: it waits
    await roll(rec, agents, rounds=2)
    assert nodes.where("a") == []
    await rec._catalog.update_model("m", generation=1)
    readies = await roll(rec, agents, rounds=30)
    assert min(readies) == 2 and readies[-1] == 3  # m keeps its three
    assert agents.generations() == [1, 1, 1] and nodes.where("a") == []
