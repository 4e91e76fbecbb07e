"""Standbys answer /v1: the replicas the leader publishes reach a standby's pool (and its
router reaches the engine with the key it derives itself), stay while no leader exists,
and a standby's on-demand wake-ups reach the leader through the store."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw import wire
from llmgwd.catalog import ApiKey, Model, engine_key, hash_secret
from llmgwd.nodes.agent_conn import AgentConn
from llmgwd.nodes.state import ClusterState
from llmgwd.planes import registry
from llmgwd.planes.fence import FencedStore
from llmgwd.planes.leader import LEADER
from llmgwd.planes.live import LIVE, Published, Publisher, RolePool
from llmgwd.planes.wakeups import WAKE, Waker, follow
from llmgwd.router import Router
from llmgwd.store import prefix_end
from llmgwd.store.etcd_http import EtcdUnavailable
from llmgwd.store.sqlite import SqliteStore

SECRET = b"the-cluster-secret-every-control-plane-holds"
USER = "sk-llmgw-user-0123456789abcdef"
INVENTORY = wire.Inventory(cores=2, memory_bytes=8 << 30, memory_free_bytes=4 << 30)
log = logging.getLogger(__name__)


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(":memory:")
    yield s
    await s.close()


async def eventually(check: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Wait until check() is true (a generous bound: the test never fails on a time)."""
    async with asyncio.timeout(timeout_s):
        while not check():  # noqa: ASYNC110 (several tasks, no one event)
            await asyncio.sleep(0.01)


class FakeWs:
    """An agent's WebSocket as the cluster state uses it."""

    async def send_bytes(self, data: bytes) -> None:
        pass

    async def close(self, **_: Any) -> bool:
        return True


async def leader_state(port: int, state: wire.ReplicaState = "ready") -> ClusterState:
    """A leader's cluster state: node n1 registered, told to run r1, reporting it."""
    s = ClusterState(grace_s=30)
    conn = AgentConn("n1", FakeWs(), "127.0.0.1", "1", b"")  # type: ignore[arg-type]
    await s._attach(conn, wire.Register("n1", "127.0.0.1", "t", INVENTORY))
    spec = wire.ReplicaSpec(
        "r1", "smol", "llama.cpp", "file:/m.gguf", api_key=engine_key(SECRET, "r1")
    )
    s.set_desired("n1", [spec])
    s._report(conn, wire.Heartbeat(INVENTORY, [wire.ReplicaStatus("r1", "smol", state, port=port)]))
    return s


async def term_of(store: SqliteStore) -> int:
    await store.put(LEADER, b"{}")
    kv = await store.get(LEADER)
    assert kv is not None
    return kv.create_revision


@dataclass
class Tasks:
    running: list[asyncio.Task[Any]]

    def start(self, work: Any) -> asyncio.Task[Any]:
        t = asyncio.create_task(work)
        self.running.append(t)
        return t


@pytest.fixture
async def tasks() -> AsyncIterator[Tasks]:
    t = Tasks([])
    yield t
    for task in t.running:
        task.cancel()
    await asyncio.gather(*t.running, return_exceptions=True)


async def test_a_standby_knows_the_leaders_ready_replicas_and_keeps_them_with_no_leader(
    store: SqliteStore, tasks: Tasks
) -> None:
    published = Published(store, SECRET)
    tasks.start(published.follow())
    standby = RolePool(ClusterState(), published)
    state = await leader_state(20001)
    fenced = FencedStore(store, await term_of(store), lambda _: None)
    started = time.monotonic()
    publisher = tasks.start(Publisher(fenced, state, grace_s=30).run())

    await eventually(lambda: standby.ready("smol"))
    log.info("a standby knew the replica %.3f s after the leader began", time.monotonic() - started)
    (ep,) = standby.ready("smol")
    assert (ep.replica_id, ep.node, ep.url) == ("r1", "n1", "http://127.0.0.1:20001")
    assert ep.api_key == engine_key(SECRET, "r1")  # derived here: no key is in the store
    assert b"api_key" not in b"".join(
        kv.value for kv in (await store.range(LIVE, prefix_end(LIVE)))[0]
    )
    assert standby.wanted("smol") == 1

    publisher.cancel()  # the leader dies: its lease (and /leader) go, the published keys stay
    await store.delete(LEADER)
    await asyncio.sleep(0.2)
    assert [e.replica_id for e in standby.ready("smol")] == ["r1"]


async def test_a_new_leader_keeps_the_published_replicas_of_nodes_not_back_yet(
    store: SqliteStore, tasks: Tasks
) -> None:
    published = Published(store, SECRET)
    tasks.start(published.follow())
    pool = RolePool(ClusterState(), published)
    old = FencedStore(store, await term_of(store), lambda _: None)
    await Publisher(old, await leader_state(20001), grace_s=30).publish()
    await eventually(lambda: pool.ready("smol"))

    await store.delete(LEADER)
    new_state = ClusterState(grace_s=30)  # no agent has reconnected yet
    new = Publisher(FencedStore(store, await term_of(store), lambda _: None), new_state, grace_s=30)
    await new.load()
    await new.publish()
    assert [e.replica_id for e in pool.ready("smol")] == ["r1"]


async def test_a_replica_no_longer_ready_leaves_the_standbys_pool(
    store: SqliteStore, tasks: Tasks
) -> None:
    published = Published(store, SECRET)
    tasks.start(published.follow())
    standby = RolePool(ClusterState(), published)
    fenced = FencedStore(store, await term_of(store), lambda _: None)
    await Publisher(fenced, await leader_state(20001), grace_s=30).publish()
    await eventually(lambda: standby.ready("smol"))

    await Publisher(fenced, await leader_state(20001, "failed"), grace_s=30).publish()

    await eventually(lambda: not standby.ready("smol"))
    assert standby.wanted("smol") == 1


class Keys:
    def authenticate(self, secret: str) -> ApiKey | None:
        if hash_secret(secret) == hash_secret(USER):
            return ApiKey(id="k", name="u", hash="", prefix="sk-llmgw-u")
        return None


class Models:
    def get(self, name: str) -> Model | None:
        return Model(name=name, source="file:/m.gguf") if name == "smol" else None

    def all(self) -> list[Model]:
        return [Model(name="smol", source="file:/m.gguf")]


async def engine_app(seen: list[str]) -> web.Application:
    """An engine that answers only its own key (engine_key of its replica)."""

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != f"Bearer {engine_key(SECRET, 'r1')}":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        answer = {"id": "x", "object": "chat.completion", "created": 1, "model": "smol",
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                               "finish_reason": "stop"}]}  # fmt: skip
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def test_a_standbys_router_reaches_the_engine_with_the_key_it_derives(
    store: SqliteStore, tasks: Tasks
) -> None:
    seen: list[str] = []
    engine = TestServer(await engine_app(seen), host="127.0.0.1")
    await engine.start_server()
    published = Published(store, SECRET)
    tasks.start(published.follow())
    fenced = FencedStore(store, await term_of(store), lambda _: None)
    await Publisher(fenced, await leader_state(engine.port or 0), grace_s=30).publish()
    router = Router(Keys(), Models(), RolePool(ClusterState(), published))
    server = TestServer(_mounted(router), host="127.0.0.1")
    await server.start_server()
    try:
        await eventually(lambda: published.ready("smol"))
        async with aiohttp.ClientSession() as http:
            body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}]}
            headers = {"Authorization": f"Bearer {USER}"}
            async with http.post(server.make_url("/v1/chat/completions"), json=body,
                                 headers=headers) as resp:  # fmt: skip
                status, answer = resp.status, await resp.json()
        assert status == 200, answer
        assert answer["choices"][0]["message"]["content"] == "hi"
        assert len(seen) == 1
    finally:
        await server.close()
        await engine.close()
        await router.close()


def _mounted(router: Router) -> web.Application:
    root = web.Application()
    root.add_subapp("/v1", router.app)
    return root


# Wake-ups


class Touched:
    def __init__(self) -> None:
        self.names: list[str] = []

    def touch(self, name: str) -> None:
        self.names.append(name)


async def test_a_standbys_wake_up_reaches_the_leader_once_a_while(
    store: SqliteStore, tasks: Tasks
) -> None:
    leader = Touched()
    tasks.start(follow(store, await store.revision(), leader.touch))
    standby = Waker(store, "cp2", lambda: None, lambda: 0)

    for _ in range(50):  # a burst of requests for the parked model
        standby.touch("smol")

    await eventually(lambda: leader.names)
    await asyncio.sleep(0.1)
    assert leader.names == ["smol"]  # one store write for the burst, not fifty
    kv = await store.get(WAKE + "smol")
    assert kv is not None and b"cp2" in kv.value


async def test_the_leaders_own_wake_ups_write_nothing(store: SqliteStore) -> None:
    local = Touched()
    waker = Waker(store, "cp1", lambda: local, lambda: 0)
    before = await store.revision()
    waker.touch("smol")
    assert local.names == ["smol"]
    assert await store.revision() == before


# Control planes


async def test_each_control_plane_is_recorded_with_its_lease_and_role(store: SqliteStore) -> None:
    lease = await store.lease_grant(60)
    a = registry.Announcer(store, "cp1", "https://cp1:7710", lambda: lease)
    task = asyncio.create_task(a.run())
    try:
        a.renew()
        a.set_role("leader", 7)
        for _ in range(500):
            found, _ = await registry.read(store)
            if found and found[0].role == "leader":
                break
            await asyncio.sleep(0.01)
        (info,) = found
        assert (info.name, info.url, info.role, info.term) == (
            "cp1",
            "https://cp1:7710",
            "leader",
            7,
        )
        await store.lease_revoke(lease)  # it died: its record goes with its lease
        assert (await registry.read(store))[0] == []
    finally:
        task.cancel()


class _UnreachableOnce:
    """A store whose first range fails as an unreachable etcd member does."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self.failed = False

    async def range(self, key: str, end: str | None = None) -> Any:
        if not self.failed:
            self.failed = True
            raise EtcdUnavailable("https://127.0.0.1:7720", "ClientConnectorError")
        return await self._store.range(key, end)

    def watch(self, key: str, end: str | None = None, *, start_revision: int = 0) -> Any:
        return self._store.watch(key, end, start_revision=start_revision)


async def test_a_standby_follows_the_published_replicas_after_its_etcd_member_was_unreachable(
    store: SqliteStore, tasks: Tasks
) -> None:
    """etcd down when a standby (re)reads the published replicas is not the end of following
    them: it reads again once the member answers."""
    flaky = _UnreachableOnce(store)
    published = Published(flaky, SECRET)  # type: ignore[arg-type]
    follow_task = tasks.start(published.follow())
    standby = RolePool(ClusterState(), published)
    state = await leader_state(20001)
    fenced = FencedStore(store, await term_of(store), lambda _: None)
    tasks.start(Publisher(fenced, state, grace_s=30).run())
    await eventually(lambda: standby.ready("smol") or follow_task.done())
    assert flaky.failed and not follow_task.done()
    assert [e.replica_id for e in standby.ready("smol")] == ["r1"]
