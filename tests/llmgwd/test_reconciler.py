"""The reconciler: wanted counts become placements that spread, persist, and reach the nodes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from llmgw.wire import ReplicaSpec
from llmgwd.catalog import Catalog, Model, engine_key
from llmgwd.reconciler import Placement, Reconciler, plan
from llmgwd.store.sqlite import SqliteStore


class FakeNodes:
    """The cluster state as the reconciler sees it: who is connected, and what each was told."""

    def __init__(self, *names: str) -> None:
        self.names = list(names)
        self.desired: dict[str, list[ReplicaSpec]] = {}

    def connected(self) -> list[str]:
        return self.names

    def known(self) -> list[str]:
        return self.names

    def set_desired(self, node: str, specs: list[ReplicaSpec]) -> None:
        self.desired[node] = list(specs)


def test_replicas_of_a_model_spread_across_nodes() -> None:
    add, remove = plan([Model(name="m", source="file:/m", replicas=3)], [], ["a", "b", "c"])
    assert sorted(p.node for p in add) == ["a", "b", "c"] and not remove


def test_extra_replicas_are_removed_and_a_gone_model_loses_all() -> None:
    have = [Placement(id=f"m-{i}", model="m", node="a") for i in range(3)]
    have.append(Placement(id="old-1", model="old", node="a"))
    add, remove = plan([Model(name="m", source="file:/m", replicas=1)], have, ["a"])
    assert not add
    assert sorted(p.id for p in remove) == ["m-1", "m-2", "old-1"]


def test_nothing_is_placed_without_a_node() -> None:
    add, _ = plan([Model(name="m", source="file:/m", replicas=2)], [], [])
    assert add == []


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(":memory:")
    yield s
    await s.close()


async def test_a_restarted_control_plane_sends_the_same_replicas(store: SqliteStore) -> None:
    secret = b"s" * 32
    cat = Catalog(store)
    await cat.add_model(Model(name="m", source="file:/m.gguf", replicas=2))
    nodes = FakeNodes("n1")
    first = Reconciler(store, cat, nodes, secret)
    await first._load()
    await first.reconcile()
    sent = nodes.desired["n1"]
    assert len(sent) == 2
    assert all(s.api_key == engine_key(secret, s.id) for s in sent)

    again = FakeNodes("n1")
    cat2 = Catalog(store)
    await cat2.load()
    second = Reconciler(store, cat2, again, secret)
    await second._load()
    await second.reconcile()
    assert [s.id for s in again.desired["n1"]] == [s.id for s in sent]


async def test_stopping_a_model_empties_its_node(store: SqliteStore) -> None:
    cat = Catalog(store)
    await cat.add_model(Model(name="m", source="file:/m.gguf", replicas=1))
    nodes = FakeNodes("n1")
    rec = Reconciler(store, cat, nodes, b"k" * 32)
    await rec._load()
    await rec.reconcile()
    assert len(nodes.desired["n1"]) == 1
    await cat.update_model("m", replicas=0)
    await rec.reconcile()
    assert nodes.desired["n1"] == []
