"""The cluster port over real TLS on 127.0.0.1: joins, the agent link, and ClusterState."""

from __future__ import annotations

import asyncio
import logging
import ssl
import stat
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp import web

from llmgw import package_version, pki, wire
from llmgw_agentd import link as link_module
from llmgw_agentd.link import JoinError, Link, join, link_ssl_context, read_join
from llmgwd.nodes.members import Members
from llmgwd.nodes.pool import Endpoint
from llmgwd.nodes.port import bound_port, make_app, serve, server_ssl_context
from llmgwd.nodes.state import ClusterState
from llmgwd.store.sqlite import SqliteStore

INVENTORY = wire.Inventory(cores=2, memory_bytes=8 << 30, memory_free_bytes=4 << 30)
SPEC = wire.ReplicaSpec(
    id="smol-1", model="smol", engine="llama.cpp", source="file:/m.gguf", api_key="k-1"
)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Cluster:
    """One control plane's cluster port, and what its token store saw."""

    ca: pki.CertKey
    dir: Path
    members: Members
    state: ClusterState = field(init=False)
    runner: web.AppRunner = field(init=False)
    port: int = 0
    clock: Clock = field(default_factory=Clock)
    tokens: set[str] = field(default_factory=set)
    offered: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def consume(self, token: str) -> bool:
        self.offered.append(token)
        if token in self.tokens:
            self.tokens.remove(token)
            return True
        return False

    async def start(self, state: ClusterState, port: int = 0) -> None:
        """(Re)start the port with a fresh state, as a restarted llmgwd would."""
        self.state = state
        state.on_change = self.changes.append
        app = make_app(state, self.ca, self.consume, self.members)
        ctx = server_ssl_context(self.ca.cert_pem, self.dir / "s.pem", self.dir / "s.key")
        self.runner = await serve(app, "127.0.0.1", port, ctx)
        self.port = bound_port(self.runner)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    ca = pki.make_ca("test")
    pki.write_pair(pki.make_server_cert(ca), tmp_path / "s.pem", tmp_path / "s.key")
    store = await SqliteStore.open(":memory:")
    c = Cluster(ca, tmp_path, Members(store))
    await c.start(ClusterState(grace_s=30, clock=c.clock))
    yield c
    await c.runner.cleanup()
    await store.close()


def node_dir(tmp_path: Path, ca: pki.CertKey, name: str) -> Path:
    """A node's PKI files as join writes them, made directly (once: a node keeps its files)."""
    d = tmp_path / f"node-{name}-{pki.ca_fingerprint(ca.cert_pem)[:6]}"
    if (d / "node.pem").exists():
        return d
    key_pem, csr_pem = pki.make_node_csr(name)
    pki.write_pem(d / "node.key", key_pem, private=True)
    pki.write_pem(d / "node.pem", pki.sign_csr(ca, csr_pem, name))
    pki.write_pem(d / "ca.pem", ca.cert_pem)
    return d


async def eventually(check: Callable[[], object]) -> None:
    """Wait (5 s at most) until check() is true."""
    async with asyncio.timeout(5):
        # Polling: the conditions span both daemons, which have no one event to wait on.
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def register(node: str, replicas: list[wire.ReplicaStatus] | None = None) -> bytes:
    msg = wire.Register(node, "127.0.0.1", "test", INVENTORY, replicas or [])
    return wire.encode(msg)


async def expect_refused(ws: aiohttp.ClientWebSocketResponse) -> str:
    frame = await ws.receive(timeout=5)
    msg = wire.decode_server(frame.data)
    assert isinstance(msg, wire.Refused)
    assert (await ws.receive(timeout=5)).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    return msg.reason


# Joining


async def test_join_with_a_good_token_gets_a_certificate(cluster: Cluster, tmp_path: Path) -> None:
    token = pki.new_join_token(cluster.ca.cert_pem)
    cluster.tokens.add(token)
    d = tmp_path / "pki"

    await join(cluster.url, token, "node1", d)

    assert stat.S_IMODE((d / "node.key").stat().st_mode) == 0o600
    assert pki.common_name((d / "node.pem").read_bytes()) == "node1"
    assert (d / "ca.pem").read_bytes() == cluster.ca.cert_pem
    assert read_join(d).node == "node1" and read_join(d).server == cluster.url
    link_ssl_context(d)  # the files make a usable TLS identity


async def test_wrong_token_is_refused_and_nothing_is_written(
    cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    token = pki.new_join_token(cluster.ca.cert_pem)  # right CA, unknown secret

    with pytest.raises(JoinError, match="invalid, expired or already used"):
        await join(cluster.url, token, "node1", tmp_path / "pki")

    assert not (tmp_path / "pki").exists()
    refusals = [
        r for r in caplog.records if r.name == "llmgwd.nodes.port" and "refused" in r.message
    ]
    assert len(refusals) == 1
    assert token.split(".")[1] not in caplog.text


async def test_token_for_another_ca_is_not_sent(cluster: Cluster, tmp_path: Path) -> None:
    token = pki.new_join_token(pki.make_ca("impostor").cert_pem)
    cluster.tokens.add(token)

    with pytest.raises(JoinError, match="not the one the join token names"):
        await join(cluster.url, token, "node1", tmp_path / "pki")

    assert cluster.offered == []
    assert not (tmp_path / "pki").exists()


async def test_a_token_works_once(cluster: Cluster, tmp_path: Path) -> None:
    token = pki.new_join_token(cluster.ca.cert_pem)
    cluster.tokens.add(token)
    await join(cluster.url, token, "node1", tmp_path / "one")

    with pytest.raises(JoinError, match="already used"):
        await join(cluster.url, token, "node2", tmp_path / "two")
    assert not (tmp_path / "two").exists()


async def test_a_connected_node_name_cannot_be_joined_again(
    cluster: Cluster, tmp_path: Path
) -> None:
    token = pki.new_join_token(cluster.ca.cert_pem)
    cluster.tokens.add(token)
    async with aiohttp.ClientSession() as s:
        ctx = link_ssl_context(node_dir(tmp_path, cluster.ca, "a"))
        async with s.ws_connect(f"{cluster.url}/agent", ssl=ctx) as ws:
            await ws.send_bytes(register("a"))
            await eventually(lambda: cluster.state.connected() == ["a"])

            with pytest.raises(JoinError, match="connected now"):
                await join(cluster.url, token, "a", tmp_path / "pki")
    assert token in cluster.tokens  # not spent on a refused join


# The agent link


@dataclass
class Agent:
    """What llmgw-agentd gives a Link: its statuses, and where Desired sets go."""

    statuses: list[wire.ReplicaStatus] = field(default_factory=list)
    desired: asyncio.Queue[list[wire.ReplicaSpec]] = field(default_factory=asyncio.Queue)

    async def on_desired(self, specs: list[wire.ReplicaSpec]) -> None:
        await self.desired.put(specs)

    def link(self, cluster: Cluster, pki_dir: Path, node: str) -> Link:
        return Link(
            cluster.url,
            pki_dir,
            node,
            version="test",
            inventory=lambda: INVENTORY,
            replicas=lambda: self.statuses,
            on_desired=self.on_desired,
            heartbeat_s=0.05,
        )


@pytest.fixture
async def running() -> AsyncIterator[Callable[[Link], None]]:
    tasks: list[asyncio.Task[None]] = []
    yield lambda link: tasks.append(asyncio.create_task(link.run()))
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_agent_registers_gets_desired_and_its_replica_joins_the_pool(
    cluster: Cluster, tmp_path: Path, running: Callable[[Link], None]
) -> None:
    state, agent = cluster.state, Agent()
    state.set_desired("n1", [SPEC])
    running(agent.link(cluster, node_dir(tmp_path, cluster.ca, "n1"), "n1"))

    assert await asyncio.wait_for(agent.desired.get(), 5) == [SPEC]
    await eventually(lambda: state.connected() == ["n1"])
    assert "n1" in cluster.changes and state.ready("smol") == [] and state.wanted("smol") == 1

    # The agent starts it; a replica the control plane did not ask for is never routed to.
    rogue = wire.ReplicaStatus(id="rogue", model="smol", state="ready", port=20002)
    agent.statuses = [
        wire.ReplicaStatus(id="smol-1", model="smol", state="ready", port=20001, slots=2)
    ]
    agent.statuses.append(rogue)
    await eventually(lambda: state.ready("smol"))
    assert state.ready("smol") == [
        Endpoint("smol-1", "smol", "n1", "http://127.0.0.1:20001", "k-1", slots=2)
    ]  # its slots as its agent reported them: the router's cap
    node = state.node("n1")
    assert node is not None and node.address == "127.0.0.1" and node.inventory == INVENTORY

    state.set_desired("n1", [])  # sent at once to the connected agent
    assert await asyncio.wait_for(agent.desired.get(), 5) == []
    assert state.ready("smol") == [] and state.wanted("smol") == 0


async def test_agent_without_a_certificate_cannot_open_the_link(cluster: Cluster) -> None:
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await s.ws_connect(f"{cluster.url}/agent", ssl=pki.client_context(cluster.ca.cert_pem))
    assert e.value.status == 401


async def test_certificate_from_another_ca_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    other = pki.make_ca("other")
    d = node_dir(tmp_path, other, "n1")
    ctx = pki.client_context(cluster.ca.cert_pem, d / "node.pem", d / "node.key")

    async with aiohttp.ClientSession() as s:
        # TLS 1.3: the server's refusal comes as the handshake's last word, so as a disconnect.
        with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
            await s.ws_connect(f"{cluster.url}/agent", ssl=ctx)
    assert cluster.state.nodes() == []


async def test_node_a_cannot_register_as_node_b(cluster: Cluster, tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as s:
        ctx = link_ssl_context(node_dir(tmp_path, cluster.ca, "a"))
        async with s.ws_connect(f"{cluster.url}/agent", ssl=ctx) as ws:
            await ws.send_bytes(register("b"))
            assert "'a'" in await expect_refused(ws)
    assert cluster.state.nodes() == []


async def test_garbage_is_refused_and_others_are_still_served(
    cluster: Cluster, tmp_path: Path
) -> None:
    async with aiohttp.ClientSession() as s:
        url = f"{cluster.url}/agent"
        bad = link_ssl_context(node_dir(tmp_path, cluster.ca, "a"))
        async with s.ws_connect(url, ssl=bad) as ws:
            await ws.send_str("{not json")
            assert "not a valid message" in await expect_refused(ws)

        good = link_ssl_context(node_dir(tmp_path, cluster.ca, "b"))
        async with s.ws_connect(url, ssl=good) as ws:
            await ws.send_bytes(register("b"))
            await eventually(lambda: cluster.state.connected() == ["b"])
            await ws.send_bytes(msgspec.json.encode({"type": "heartbeat"}))  # lacks inventory
            assert "inventory" in await expect_refused(ws)


async def test_a_second_connection_replaces_the_first(cluster: Cluster, tmp_path: Path) -> None:
    ctx = link_ssl_context(node_dir(tmp_path, cluster.ca, "a"))
    async with aiohttp.ClientSession() as s:
        url = f"{cluster.url}/agent"
        async with s.ws_connect(url, ssl=ctx) as first, s.ws_connect(url, ssl=ctx) as second:
            await first.send_bytes(register("a"))
            await eventually(lambda: cluster.state.connected() == ["a"])
            await second.send_bytes(register("a"))
            assert (await first.receive(timeout=5)).type == aiohttp.WSMsgType.CLOSE
            await asyncio.sleep(0.1)
            assert cluster.state.connected() == ["a"]


async def test_link_comes_back_after_the_control_plane_restarts(
    cluster: Cluster,
    tmp_path: Path,
    running: Callable[[Link], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "llmgw_agentd.link")
    agent = Agent([wire.ReplicaStatus(id="smol-1", model="smol", state="ready", port=20001)])
    link = agent.link(cluster, node_dir(tmp_path, cluster.ca, "n1"), "n1")
    running(link)
    await eventually(lambda: link.connected and cluster.state.connected() == ["n1"])

    await cluster.runner.cleanup()
    await eventually(lambda: not link.connected)
    await cluster.start(ClusterState(), port=cluster.port)

    await eventually(lambda: cluster.state.connected() == ["n1"])
    node = cluster.state.node("n1")
    assert node is not None and node.replicas == tuple(agent.statuses)
    await eventually(lambda: link.connected)
    said = [r.getMessage().split(" ")[0] for r in caplog.records if r.name == "llmgw_agentd.link"]
    assert [w for w in said if w != "cannot"] == ["connected", "lost", "connected"]


async def test_link_logs_an_unreachable_control_plane_once(
    cluster: Cluster,
    tmp_path: Path,
    running: Callable[[Link], None],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(link_module, "MIN_BACKOFF_S", 0.01)
    monkeypatch.setattr(link_module, "MAX_BACKOFF_S", 0.02)
    caplog.set_level(logging.DEBUG, "llmgw_agentd.link")
    link = Agent().link(cluster, node_dir(tmp_path, cluster.ca, "n1"), "n1")
    await cluster.runner.cleanup()  # nobody listens there now
    running(link)

    def tries() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "cannot connect" in r.getMessage()]

    await eventually(lambda: len(tries()) >= 5)
    assert [r.levelno for r in tries()].count(logging.WARNING) == 1


async def test_replicas_stay_in_the_pool_for_the_grace_period(
    cluster: Cluster, tmp_path: Path
) -> None:
    state, clock = cluster.state, cluster.clock
    state.set_desired("a", [SPEC])
    ready = wire.ReplicaStatus(id="smol-1", model="smol", state="ready", port=20001)
    async with aiohttp.ClientSession() as s:
        ctx = link_ssl_context(node_dir(tmp_path, cluster.ca, "a"))
        async with s.ws_connect(f"{cluster.url}/agent", ssl=ctx) as ws:
            await ws.send_bytes(register("a", [ready]))
            await eventually(lambda: len(state.ready("smol")) == 1)
    await eventually(lambda: state.connected() == [])

    clock.now += state.grace_s - 1
    assert len(state.ready("smol")) == 1
    clock.now += 2
    assert state.ready("smol") == []


async def test_a_node_not_back_within_its_grace_period_is_reported_lost_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    lost: list[str] = []
    changes_before: list[int] = []  # how many changes were told before each loss

    def on_lost(node: str) -> None:
        lost.append(node)
        changes_before.append(len(cluster.changes))

    await cluster.runner.cleanup()
    await cluster.start(ClusterState(grace_s=0.3, on_lost=on_lost))
    state = cluster.state
    async with aiohttp.ClientSession() as s:
        for name in ("a", "b"):
            ctx = link_ssl_context(node_dir(tmp_path, cluster.ca, name))
            async with s.ws_connect(f"{cluster.url}/agent", ssl=ctx) as ws:
                await ws.send_bytes(register(name))
                await eventually(lambda n=name: n in state.connected())  # type: ignore[misc]
        await eventually(lambda: state.connected() == [])
        # b comes back within its grace period; a does not.
        ctx = link_ssl_context(node_dir(tmp_path, cluster.ca, "b"))
        async with s.ws_connect(f"{cluster.url}/agent", ssl=ctx) as ws:
            await ws.send_bytes(register("b"))
            await eventually(lambda: state.connected() == ["b"])
            await eventually(lambda: lost == ["a"])
            await asyncio.sleep(0.5)
            assert lost == ["a"]  # once, and b (connected again) is not lost
            assert "a" in cluster.changes[changes_before[0] :]  # the reconciler is told at once


async def test_the_pool_is_built_once_until_something_changes(
    cluster: Cluster, tmp_path: Path
) -> None:
    """ready() is read at every /v1 request: its answer is kept until a node, its replicas or
    its desired set change (or a disconnected node's grace ends, above)."""
    state = cluster.state
    state.set_desired("a", [SPEC])
    ready = wire.ReplicaStatus(id="smol-1", model="smol", state="ready", port=20001)
    async with aiohttp.ClientSession() as s:
        ctx = link_ssl_context(node_dir(tmp_path, cluster.ca, "a"))
        async with s.ws_connect(f"{cluster.url}/agent", ssl=ctx) as ws:
            await ws.send_bytes(register("a", [ready]))
            await eventually(lambda: len(state.ready("smol")) == 1)
            first, again = state.ready("smol"), state.ready("smol")
            assert first == again and first[0] is again[0]  # the same, not built again
            state.set_desired("a", [])
            assert state.ready("smol") == []


# Versions: an agent one release behind is taken, one older or newer is refused, naming both


async def speak(cluster: Cluster, tmp_path: Path, protocol: int, *, taken: bool) -> str:
    """Register as node "v" speaking protocol: "" once taken, else the refusal's reason."""
    msg = wire.Register("v", "127.0.0.1", "0.0.9", INVENTORY, [], protocol=protocol)
    async with aiohttp.ClientSession() as s:
        ctx = link_ssl_context(node_dir(tmp_path, cluster.ca, "v"))
        async with s.ws_connect(f"{cluster.url}/agent", ssl=ctx) as ws:
            await ws.send_bytes(wire.encode(msg))
            if not taken:
                return await expect_refused(ws)
            await eventually(lambda: cluster.state.connected() == ["v"])
    await eventually(lambda: cluster.state.connected() == [])
    return ""


async def test_an_agent_one_release_behind_is_taken_older_and_newer_are_refused(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This release speaks 3 and takes the release before's 2.
    monkeypatch.setattr(wire, "PROTOCOL", 3)
    monkeypatch.setattr(wire, "OLDEST_AGENT_PROTOCOL", 2)
    assert await speak(cluster, tmp_path, 3, taken=True) == ""
    assert await speak(cluster, tmp_path, 2, taken=True) == ""
    old = await speak(cluster, tmp_path, 1, taken=False)
    assert "llmgw-agentd 0.0.9 (wire protocol 1) is too old for llmgwd" in old
    assert "takes agents of protocol 2 to 3" in old
    assert "upgrade this node's llmgw-agentd" in old
    new = await speak(cluster, tmp_path, 4, taken=False)
    assert "llmgw-agentd 0.0.9 (wire protocol 4) is newer than this control plane" in new
    assert "(wire protocol 3)" in new
    assert "upgrade the control planes first, one at a time and the leader last" in new
    assert "then the nodes" in new
    assert f"put this node's llmgw-agentd back to {package_version()}" in new
