"""`llmgw planes` and taking a control plane out: the members' health and roles, and the
refusals that keep the store's quorum (the last member never; a quorum only with --force)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from llmgw import pki, wire
from llmgw.api_types import PlaneView
from llmgwd.api.access import key_auth
from llmgwd.api.base import ApiContext, ClusterNodes
from llmgwd.api.routes import api_subapp
from llmgwd.catalog import Catalog
from llmgwd.planes.listing import (
    ControlPlanes,
    Member,
    NoSuchPlane,
    Refusal,
    remove,
    view,
)
from llmgwd.planes.tokens import PlaneTokens
from llmgwd.store import Store
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.fake_etcd import FakeEtcd

CA = pki.make_ca("test")


def three(down: set[int] | None = None) -> FakeEtcd:
    members = [Member(i, f"cp{i}", [f"https://10.0.0.{i}:7721"]) for i in (1, 2, 3)]
    return FakeEtcd(members, down or set())


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    s = await SqliteStore.open(":memory:")
    yield s
    await s.close()


async def test_view_joins_members_records_and_the_leader(store: Store) -> None:
    etcd = three(down={3})
    await etcd.add("https://10.0.0.4:7721")
    for i, role in ((1, "standby"), (2, "leader")):
        info = wire.PlaneInfo(f"cp{i}", f"https://10.0.0.{i}:7710", role)  # type: ignore[arg-type]
        await store.put(f"/servers/cp{i}", msgspec.json.encode(info))
    await store.put("/leader", b'{"name":"cp2","url":"https://10.0.0.2:7710"}')
    got = {s.name: s for s in await view(store, etcd, "cp1")}
    assert got["cp1"] == PlaneView(name="cp1", url="https://10.0.0.1:7710", member="1",
        peer_url="https://10.0.0.1:7721", health="healthy", role="standby", self=True)  # fmt: skip
    assert (got["cp2"].role, got["cp2"].health, got["cp2"].self) == ("leader", "healthy", False)
    assert (got["cp3"].role, got["cp3"].health, got["cp3"].url) == ("", "unreachable", "")
    joining = got["(joining at https://10.0.0.4:7721)"]
    assert joining.health == "not started"


async def test_a_dead_member_is_removed_a_live_one_only_with_force() -> None:
    with pytest.raises(Refusal, match="cp2's member is healthy: run `llmgw plane leave`"):
        await remove(three(), "cp2", me="cp1", force=False, leaving=False)
    etcd = three(down={3})
    gone = await remove(etcd, "cp3", me="cp1", force=False, leaving=False)
    assert gone.name == "cp3" and [m.name for m in etcd.members_] == ["cp1", "cp2"]
    with pytest.raises(NoSuchPlane, match="no control plane 'cp9'"):
        await remove(etcd, "cp9", me="cp1", force=False, leaving=False)
    with pytest.raises(Refusal, match="is this control plane"):
        await remove(etcd, "cp1", me="cp1", force=True, leaving=False)


async def test_quorum_is_kept_unless_forced() -> None:
    etcd = three(down={3})
    # cp1 leaving: cp2 and cp3 left, cp3 dead: 1 healthy of 2, their quorum is 2.
    with pytest.raises(Refusal, match="1 of the 2 members left are healthy, fewer than the 2"):
        await remove(etcd, "cp1", me="cp1", force=False, leaving=True)
    assert len(etcd.members_) == 3
    await remove(etcd, "cp1", me="cp1", force=True, leaving=True)
    assert [m.name for m in etcd.members_] == ["cp2", "cp3"]


async def test_the_last_member_is_never_removed() -> None:
    etcd = FakeEtcd()
    with pytest.raises(Refusal, match="last member of the store's cluster"):
        await remove(etcd, "cp1", me="cp1", force=True, leaving=True)
    assert len(etcd.members_) == 1


async def _call(
    store: Store, etcd: FakeEtcd | None, method: str, path: str, body: object = None
) -> tuple[int, object]:
    catalog = Catalog(store)
    await catalog.load()
    planes = ControlPlanes(store, etcd, PlaneTokens(store, CA.cert_pem), "cp1", "https://cp1:7710")
    ctx = ApiContext(catalog=catalog, nodes=ClusterNodes(list), mint_token=lambda: "t",
                     join_url="https://cp1:7710", control_planes=planes)  # fmt: skip
    app = web.Application()
    app.add_subapp("/api/v1", api_subapp(ctx, key_auth(catalog)))
    _, admin = await catalog.create_key("a", "admin")
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with (
            ClientSession() as s,
            s.request(
                method,
                str(server.make_url("/api/v1" + path)),
                json=body,
                headers={"Authorization": f"Bearer {admin}"},
            ) as r,  # fmt: skip
        ):
            return r.status, await r.json()
    finally:
        await server.close()


async def test_the_api_lists_makes_tokens_and_refuses(store: Store) -> None:
    status, answer = await _call(store, three(), "GET", "/planes")
    assert status == 200 and [s["name"] for s in answer] == ["cp1", "cp2", "cp3"]  # type: ignore[attr-defined]
    status, answer = await _call(store, three(), "POST", "/planes/tokens", {})
    assert status == 201 and isinstance(answer, dict)
    assert answer["command"].startswith("llmgw plane join https://cp1:7710 --token ")
    assert pki.token_matches_ca(answer["token"], CA.cert_pem)
    status, answer = await _call(store, FakeEtcd(), "POST", "/planes/leave", {})
    assert status == 409 and "last member" in str(answer)
    status, answer = await _call(store, three(down={3}), "DELETE", "/planes/cp3", {})
    assert status == 200 and isinstance(answer, dict) and answer["removed"]
    status, answer = await _call(store, three(), "DELETE", "/planes/nope", {})
    assert status == 404


async def test_on_sqlite_no_token_is_made(store: Store) -> None:
    status, answer = await _call(store, None, "POST", "/planes/tokens", {})
    assert status == 409 and "llmgw plane migrate --to etcd" in str(answer)
    status, answer = await _call(store, None, "GET", "/planes")
    assert status == 200 and answer == []


async def test_the_old_servers_paths_answer_as_the_planes_ones(store: Store) -> None:
    # /api/v1/servers... is what llmgw commands made before "planes" call: deprecated, kept.
    listed = await _call(store, three(), "GET", "/planes")
    assert await _call(store, three(), "GET", "/servers") == listed
    status, answer = await _call(store, three(), "POST", "/servers/tokens", {})
    assert status == 201 and isinstance(answer, dict)
    assert pki.token_matches_ca(answer["token"], CA.cert_pem)
    status, answer = await _call(store, FakeEtcd(), "POST", "/servers/leave", {})
    assert status == 409 and "last member" in str(answer)
    status, answer = await _call(store, three(down={3}), "DELETE", "/servers/cp3", {})
    assert status == 200 and isinstance(answer, dict) and answer["removed"]
