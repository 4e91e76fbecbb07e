"""POST /api/v1/models/{name}/restart and PUT .../context answer how the replicas will roll
to the new settings (one at a time; in place for one replica with no room beside it), the
model's view says it until every replica runs them, and PUT .../max_tokens rolls nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from llmgwd.api.access import peercred_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog
from llmgwd.placement.reconciler import Reconciler
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd import test_api
from tests.llmgwd.test_reconciler import Clock, FakeNodes, smol
from tests.llmgwd.test_rolling import ONE_CORE


class Cluster:
    """/api/v1 over a catalog whose reconciler places on nodes the test sets."""

    def __init__(self, api: aiohttp.ClientSession, rec: Reconciler, nodes: FakeNodes) -> None:
        self.api, self.rec, self.nodes = api, rec, nodes

    async def settle(self) -> None:
        """Passes until every replica the nodes were told of is ready."""
        for _ in range(6):
            await self.rec.reconcile()
            self.nodes.report()


@pytest.fixture
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    await catalog.add_model(smol(replicas=1))
    nodes = FakeNodes(*request.param)
    if len(request.param) == 1:
        nodes.by_name["a"].inventory = ONE_CORE  # no room for a second replica
    clock = Clock()
    rec = Reconciler(store, catalog, nodes, b"s" * 32, clock=clock)
    await rec.load()
    ctx = ApiContext(
        catalog=catalog,
        nodes=test_api.FakeNodes(),
        mint_token=test_api.Tokens(),
        join_url=test_api.JOIN_URL,
        scheduling=rec,
    )
    async with test_api.serve(api_app(ctx, peercred_auth("llmgw")), tmp_path / "d.sock") as api:
        c = Cluster(api, rec, nodes)
        await c.settle()
        clock.now += 61  # past the reconciler's grace after start: rolls step
        yield c
    await store.close()


@pytest.mark.parametrize("cluster", [("a",)], indirect=True)
async def test_one_replica_without_room_restarts_in_place_and_says_so(cluster: Cluster) -> None:
    status, answer = await test_api.call(cluster.api, "PUT", "/models/m/context", {"context": 2048})
    assert status == 200 and "it restarts in place" in answer["rollout"]
    await cluster.settle()
    _, view = await test_api.call(cluster.api, "GET", "/models/m")
    assert view["rollout"] == ""  # done
    assert [s.context for s in cluster.nodes.desired["a"]] == [2048]
    status, answer = await test_api.call(cluster.api, "POST", "/models/m/restart")
    assert status == 200 and "it restarts in place" in answer["rollout"]


@pytest.mark.parametrize("cluster", [("a", "b")], indirect=True)
async def test_a_restart_with_room_starts_a_new_replica_beside(cluster: Cluster) -> None:
    [before] = cluster.rec.placements()
    status, answer = await test_api.call(cluster.api, "POST", "/models/m/restart")
    assert status == 200 and "started beside an old one" in answer["rollout"]
    await cluster.rec.reconcile()
    _, models = await test_api.call(cluster.api, "GET", "/models")
    assert "replacing 1 replica" in models[0]["rollout"]
    assert len(cluster.rec.placements()) == 2  # the new one beside the old
    await cluster.settle()
    [after] = cluster.rec.placements()
    assert after.id != before.id and cluster.rec.rollout(cluster.rec._catalog.all()[0]) == ""


@pytest.mark.parametrize("cluster", [("a",)], indirect=True)
async def test_a_new_max_tokens_rolls_nothing(cluster: Cluster) -> None:
    [before] = cluster.rec.placements()
    status, answer = await test_api.call(
        cluster.api, "PUT", "/models/m/max_tokens", {"max_tokens": 256}
    )
    assert status == 200 and answer["rollout"] == ""
    await cluster.settle()
    assert cluster.rec.placements() == [before]
