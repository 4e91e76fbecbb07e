"""Slurm's settings through /api/v1/slurm: shown, changed field by field, checked, kept."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.api_types import SlurmNodeView
from llmgwd.api.access import peercred_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog
from llmgwd.nodes.members import Members
from llmgwd.slurm.settings import SETTINGS, Busy, SettingsStore, SlurmSettingsIn
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.test_api import JOIN_URL, FakeNodes, Tokens, call, serve

STATUS: list[SlurmNodeView] = []  # what the leader's Slurm task says of the nodes


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(":memory:")
    for name in ("n1", "n2"):  # joined nodes (only those may be in Slurm)
        await Members(s).admit(name, "serial-" + name)
    yield s
    await s.close()


@pytest.fixture
async def client(store: SqliteStore, tmp_path: Path) -> AsyncIterator[aiohttp.ClientSession]:
    catalog = Catalog(store)
    await catalog.load()
    ctx = ApiContext(
        catalog=catalog,
        nodes=FakeNodes(),
        mint_token=Tokens(),
        join_url=JOIN_URL,
        slurm=SettingsStore(store),
        slurm_status=lambda: STATUS,
    )
    async with serve(api_app(ctx, peercred_auth("llmgw")), tmp_path / "d.sock") as session:
        yield session


async def test_slurm_is_off_until_set(client: aiohttp.ClientSession) -> None:
    status, body = await call(client, "GET", "/slurm")
    assert status == 200
    assert body == {
        "enabled": False,
        "cluster_name": "llmgw",
        "controller": "",
        "nodes": [],
        "lent": [],
        "partition": "llmgw",
        "hold_for_s": 120,
        "all_nodes": False,
        "status": [],
    }


async def test_a_change_keeps_the_fields_it_does_not_give(
    client: aiohttp.ClientSession, store: SqliteStore
) -> None:
    first = {"enabled": True, "controller": "cp1", "nodes": ["n1", "n2"], "partition": "gpu"}
    status, body = await call(client, "PUT", "/slurm", first)
    assert status == 200 and body["nodes"] == ["n1", "n2"]

    status, body = await call(client, "PUT", "/slurm", {"lent": ["n1"]})

    assert status == 200
    assert (body["enabled"], body["controller"], body["lent"]) == (True, "cp1", ["n1"])
    assert (body["partition"], body["cluster_name"]) == ("gpu", "llmgw")
    # Kept in the store: another control plane reads the same.
    assert (await SettingsStore(store).get()).lent == ["n1"]


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"cluster_name": "Has Space"}, "cluster_name"),
        ({"cluster_name": "x" * 41}, "cluster_name"),
        ({"partition": "a b"}, "partition"),
        ({"controller": "no/slash"}, "controller"),
        ({"nodes": ["n1", "n1"]}, "nodes"),
        ({"nodes": ["-bad"]}, "nodes"),
        ({"nodes": ["n1"], "lent": ["n2"]}, "lent"),
        ({"hold_for_s": -1}, "hold_for_s"),
        ({"hold_for_s": 3601}, "hold_for_s"),
        ({"enabled": True}, "controller"),
        ({"enabled": "yes"}, "enabled"),
        ({"nodes": "n1"}, "nodes"),
        ({"colour": "blue"}, "colour"),
    ],
)
async def test_a_wrong_setting_is_a_400_naming_it_and_changes_nothing(
    client: aiohttp.ClientSession, change: dict[str, object], param: str
) -> None:
    status, body = await call(client, "PUT", "/slurm", change)

    assert status == 400
    assert body["error"]["param"] == param
    assert (await call(client, "GET", "/slurm"))[1]["enabled"] is False


async def test_shrinking_the_nodes_under_lent_ones_is_refused(
    client: aiohttp.ClientSession,
) -> None:
    await call(client, "PUT", "/slurm", {"nodes": ["n1", "n2"], "lent": ["n2"]})

    status, body = await call(client, "PUT", "/slurm", {"nodes": ["n1"]})

    assert (status, body["error"]["param"]) == (400, "lent")


async def test_a_node_that_has_not_joined_is_not_put_in_slurm(
    client: aiohttp.ClientSession,
) -> None:
    status, body = await call(client, "PUT", "/slurm", {"nodes": ["n1", "n9"]})

    assert (status, body["error"]["param"]) == (400, "nodes")
    assert "'n9' has not joined the cluster" in body["error"]["message"]
    assert (await call(client, "GET", "/slurm"))[1]["nodes"] == []


async def test_lend_and_reclaim_change_the_lent_nodes(client: aiohttp.ClientSession) -> None:
    setup = {"enabled": True, "controller": "n1", "nodes": ["n1", "n2"]}
    assert (await call(client, "PUT", "/slurm", setup))[0] == 200

    status, body = await call(client, "POST", "/slurm/nodes/n2/lend")
    assert (status, body["lent"]) == (200, ["n2"])
    assert (await call(client, "POST", "/slurm/nodes/n2/lend"))[1]["lent"] == ["n2"]  # once
    status, body = await call(client, "POST", "/slurm/nodes/n2/reclaim")
    assert (status, body["lent"]) == (200, [])


async def test_lending_a_node_not_in_slurm_or_with_slurm_off_is_refused(
    client: aiohttp.ClientSession,
) -> None:
    status, body = await call(client, "POST", "/slurm/nodes/n1/lend")
    assert status == 409 and "Slurm is off" in body["error"]["message"]

    await call(client, "PUT", "/slurm", {"enabled": True, "controller": "n1", "nodes": ["n1"]})
    status, body = await call(client, "POST", "/slurm/nodes/n2/lend")
    assert status == 409 and "'n2' is not one of Slurm's nodes" in body["error"]["message"]


async def test_each_nodes_standing_is_shown(client: aiohttp.ClientSession) -> None:
    STATUS.append(SlurmNodeView(name="n1", status="reclaiming: 2 jobs running", held=True,
                                state="draining", jobs=["4", "5"]))  # fmt: skip
    try:
        status, body = await call(client, "GET", "/slurm")
    finally:
        STATUS.clear()

    assert status == 200
    assert body["status"][0]["status"] == "reclaiming: 2 jobs running"
    assert body["status"][0]["jobs"] == ["4", "5"]


class RacedStore(SqliteStore):
    """Every compare-and-put loses to another writer."""

    async def txn(self, compare: Any, success: Any, failure: Any = None) -> Any:
        await self.put(SETTINGS, b"{}")
        return await super().txn(compare, success, failure)


async def test_a_change_raced_for_ever_gives_up() -> None:
    store = await RacedStore.open(":memory:")
    try:
        with pytest.raises(Busy):
            await SettingsStore(store).change(SlurmSettingsIn(partition="gpu"))
    finally:
        await store.close()


async def test_with_all_nodes_any_member_may_be_lent(client: aiohttp.ClientSession) -> None:
    on = {"enabled": True, "controller": "n1", "all_nodes": True}
    status, body = await call(client, "PUT", "/slurm", on)
    assert status == 200 and (body["all_nodes"], body["nodes"]) == (True, [])

    status, body = await call(client, "POST", "/slurm/nodes/n2/lend")
    assert status == 200 and body["lent"] == ["n2"]
    status, body = await call(client, "POST", "/slurm/nodes/n9/lend")  # never joined
    assert status == 409 and "'n9' has not joined the cluster" in body["error"]["message"]
