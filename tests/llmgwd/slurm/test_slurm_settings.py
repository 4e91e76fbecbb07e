"""Slurm's settings through /api/v1/slurm: shown, changed field by field, checked, kept."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from llmgwd.api import ApiContext, api_app, peercred_auth
from llmgwd.catalog import Catalog
from llmgwd.slurm.settings import SettingsStore
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.test_api import JOIN_URL, FakeNodes, Tokens, call, serve


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(":memory:")
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
