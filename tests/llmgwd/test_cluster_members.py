"""Node membership on the cluster port, over real TLS: removal, joins under a member's name,
and certificates renewed over the link."""

from __future__ import annotations

import asyncio
import datetime
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from llmgw import pki, wire
from llmgw_agentd import renew
from llmgw_agentd.link import JoinError, Link, join, link_ssl_context
from llmgwd.nodes import state as cluster_module
from llmgwd.nodes.members import Members, refusal
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.test_cluster import SPEC, Agent, Cluster, eventually, node_dir, register
from tests.llmgwd.test_cluster import cluster as cluster  # a fixture
from tests.llmgwd.test_cluster import running as running  # a fixture

DAY_S = 86400.0


class WallClock:
    """The agent's wall clock, moved by hand (certificates' validity)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def joined(c: Cluster, tmp_path: Path, name: str, where: str = "") -> Path:
    """A node joined with a token, as `llmgw node join` does it; its files in where."""
    token = pki.new_join_token(c.ca.cert_pem)
    c.tokens.add(token)
    d = tmp_path / (where or f"joined-{name}")
    await join(c.url, token, name, d)
    return d


async def first_message(c: Cluster, pki_dir: Path, name: str) -> wire.ServerMessage:
    """What the cluster port answers a Register from the node whose files are in pki_dir."""
    async with aiohttp.ClientSession() as s:
        ctx = link_ssl_context(pki_dir)
        async with s.ws_connect(f"{c.url}/agent", ssl=ctx) as ws:
            await ws.send_bytes(register(name))
            frame = await ws.receive(timeout=5)
            return wire.decode_server(frame.data)


def link(c: Cluster, agent: Agent, d: Path, name: str, clock: WallClock) -> Link:
    return Link(
        c.url,
        d,
        name,
        version="test",
        inventory=lambda: wire.Inventory(cores=1, memory_bytes=1, memory_free_bytes=1),
        replicas=lambda: agent.statuses,
        on_desired=agent.on_desired,
        heartbeat_s=0.05,
        clock=clock,
    )


async def test_a_removed_nodes_certificate_is_refused_at_the_cluster_port(
    cluster: Cluster,
    tmp_path: Path,
    running: Callable[[Link], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, "llmgw_agentd.link")
    d = await joined(cluster, tmp_path, "n1")
    lost: list[str] = []
    cluster.state.on_lost = lost.append
    cluster.state.set_desired("n1", [SPEC])
    agent = Agent()
    ln = link(cluster, agent, d, "n1", WallClock())
    running(ln)
    assert await asyncio.wait_for(agent.desired.get(), 5) == [SPEC]

    assert await cluster_module.remove_node(cluster.state, cluster.members, "n1")

    # The live connection is refused and closed; the node is forgotten (its replicas are
    # placed elsewhere by the reconciler) and its requests in flight are moved at once.
    await eventually(lambda: "removed" in ln.refused)
    assert cluster.state.connected() == [] and cluster.state.known() == []
    assert lost == ["n1"] and cluster.state.wanted("smol") == 0
    # Its certificate is refused from now on, by a connection of its own.
    refused = await first_message(cluster, d, "n1")
    assert isinstance(refused, wire.Refused) and "removed" in refused.reason
    # The agent says so once, however often it tries again.
    said = [r for r in caplog.records if r.name == "llmgw_agentd.link" and "removed" in r.message]
    assert [r.levelno for r in said].count(logging.WARNING) == 1
    # Removing it again, or a node never seen, finds nothing.
    assert not await cluster_module.remove_node(cluster.state, cluster.members, "n1")
    assert not await cluster_module.remove_node(cluster.state, cluster.members, "nope")


async def test_a_token_cannot_take_a_disconnected_members_name(
    cluster: Cluster, tmp_path: Path, running: Callable[[Link], None]
) -> None:
    d = await joined(cluster, tmp_path, "n1")
    ctx = link_ssl_context(d)
    async with aiohttp.ClientSession() as s, s.ws_connect(f"{cluster.url}/agent", ssl=ctx) as ws:
        await ws.send_bytes(register("n1"))
        await eventually(lambda: cluster.state.connected() == ["n1"])
    await eventually(lambda: cluster.state.connected() == [])
    cluster.state.set_desired("n1", [SPEC])  # its engines' keys, waiting for it

    token = pki.new_join_token(cluster.ca.cert_pem)
    cluster.tokens.add(token)
    with pytest.raises(JoinError, match="is a member of the cluster; remove it first"):
        await join(cluster.url, token, "n1", tmp_path / "thief")
    assert token in cluster.tokens  # not spent on a refused join
    assert not (tmp_path / "thief").exists()

    # Nor does a certificate the CA signed that the cluster did not issue to the member.
    rogue = node_dir(tmp_path, cluster.ca, "n1")
    answer = await first_message(cluster, rogue, "n1")
    assert isinstance(answer, wire.Refused) and "no longer valid" in answer.reason
    # The member itself is still taken, and gets its desired set.
    answer = await first_message(cluster, d, "n1")
    # slurm_pending: this cluster has no leader's Slurm task, so it has not heard its state
    # (ed70839); stopping: it takes a replica's "stopping" (8c79d18); upgrades: it takes an
    # agent's upgrade reports (0176f5c).
    assert answer == wire.Desired(
        [SPEC], renews=True, mirror=True, slurm_pending=True, stopping=True, upgrades=True
    )


async def test_a_node_not_known_here_is_revoked_all_the_same(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Joined before membership records were kept, not connected since llmgwd started,
    # nothing placed on it: a stolen node, say, with its old five-year certificate.
    d = node_dir(tmp_path, cluster.ca, "old-node")
    assert not await cluster_module.remove_node(cluster.state, cluster.members, "old-node")
    answer = await first_message(cluster, d, "old-node")
    assert isinstance(answer, wire.Refused) and "removed" in answer.reason
    member = await cluster.members.get("old-node")
    assert member is not None and not member.active  # not adopted
    # The name comes back by a token join only, and only the new certificate works.
    new = await joined(cluster, tmp_path, "old-node")
    cluster.state.set_desired("old-node", [])
    assert isinstance(await first_message(cluster, new, "old-node"), wire.Desired)
    assert isinstance(await first_message(cluster, d, "old-node"), wire.Refused)
    with pytest.raises(pki.PKIError):
        await cluster_module.remove_node(cluster.state, cluster.members, "../x")


async def test_a_token_cannot_take_the_name_of_an_old_node_with_replicas(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Joined before membership records were kept, not connected since llmgwd started, but
    # its replicas are placed: its engines' keys wait for its connection.
    cluster.state.set_desired("old-node", [SPEC])
    token = pki.new_join_token(cluster.ca.cert_pem)
    cluster.tokens.add(token)
    with pytest.raises(JoinError, match="is a member of the cluster; remove it first"):
        await join(cluster.url, token, "old-node", tmp_path / "thief")
    assert token in cluster.tokens


async def test_a_removed_node_joins_again_with_a_token_and_only_its_new_certificate_works(
    cluster: Cluster, tmp_path: Path
) -> None:
    old = await joined(cluster, tmp_path, "n1")
    assert await cluster_module.remove_node(cluster.state, cluster.members, "n1")

    new = await joined(cluster, tmp_path, "n1", "again")
    cluster.state.set_desired("n1", [])  # so that a taken connection is answered at once

    assert isinstance(await first_message(cluster, new, "n1"), wire.Desired)
    answer = await first_message(cluster, old, "n1")
    assert isinstance(answer, wire.Refused) and "no longer valid" in answer.reason


async def test_a_certificate_near_its_end_is_renewed_over_the_link(
    cluster: Cluster,
    tmp_path: Path,
    running: Callable[[Link], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    d = await joined(cluster, tmp_path, "n1")
    first = (d / "node.pem").read_bytes()
    start, end = pki.validity(first)
    assert end - start <= datetime.timedelta(days=pki.NODE_DAYS, minutes=10)
    shutil.copytree(d, tmp_path / "old")
    cluster.state.set_desired("n1", [])  # so that a taken connection is answered at once
    clock = WallClock()
    clock.now += 21 * DAY_S  # past two thirds of its 30 days, before its end
    agent = Agent()
    ln = link(cluster, agent, d, "n1", clock)
    running(ln)

    await eventually(lambda: (d / "node.pem").read_bytes() != first)
    renewed = (d / "node.pem").read_bytes()
    pki.check_node_cert(renewed, cluster.ca.cert_pem, "n1", (d / "node.key").read_bytes())
    assert pki.serial_of(renewed) != pki.serial_of(first)
    # Over the same connection: nothing reconnected, so no engine was touched.
    await asyncio.sleep(0.3)
    registered = [r for r in caplog.records if "registered from" in r.getMessage()]
    assert len(registered) == 1 and cluster.state.connected() == ["n1"]
    renewals = [r for r in caplog.records if "certificate renewed" in r.getMessage()]
    assert len(renewals) == 2  # one line on each side, once

    # The new certificate is taken; once it has been used, the old one is not.
    assert isinstance(await first_message(cluster, d, "n1"), wire.Desired)
    answer = await first_message(cluster, tmp_path / "old", "n1")
    assert isinstance(answer, wire.Refused) and "no longer valid" in answer.reason
    # And after removal, neither is.
    assert await cluster_module.remove_node(cluster.state, cluster.members, "n1")
    for pki_dir in (d, tmp_path / "old"):
        answer = await first_message(cluster, pki_dir, "n1")
        assert isinstance(answer, wire.Refused)


async def test_a_new_agent_never_asks_an_older_control_plane_to_renew(
    cluster: Cluster,
    tmp_path: Path,
    running: Callable[[Link], None],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO)
    # An llmgwd older than Renew: its Desired says nothing of it, and it refuses a Renew as
    # not a valid message.
    older = msgspec.json.Decoder(wire.Register | wire.Heartbeat)
    monkeypatch.setattr(wire, "decode_agent", older.decode)

    async def send_desired(self: cluster_module.ClusterState, conn: Any) -> None:
        async with conn.lock:
            await conn.ws.send_bytes(b'{"type":"desired","replicas":[]}')

    monkeypatch.setattr(cluster_module.ClusterState, "_send_desired", send_desired)
    beats: list[wire.Heartbeat] = []
    report = cluster_module.ClusterState._report

    def counted(self: cluster_module.ClusterState, conn: Any, msg: wire.Heartbeat) -> None:
        beats.append(msg)
        report(self, conn, msg)

    monkeypatch.setattr(cluster_module.ClusterState, "_report", counted)
    # A node that joined an older llmgwd, with its long certificate, due for renewal.
    d = node_dir(tmp_path, cluster.ca, "n1")
    key_pem, csr_pem = pki.make_node_csr("n1")
    pki.write_pem(d / "node.key", key_pem, private=True)
    pki.write_pem(d / "node.pem", pki.sign_csr(cluster.ca, csr_pem, "n1", days=5 * 365))
    first = (d / "node.pem").read_bytes()
    cluster.state.set_desired("n1", [])
    clock = WallClock()
    clock.now += 21 * DAY_S
    ln = link(cluster, Agent(), d, "n1", clock)
    running(ln)

    await eventually(lambda: len(beats) >= 10)
    assert ln.connected and not ln.refused and cluster.state.connected() == ["n1"]
    registered = [r for r in caplog.records if "registered from" in r.getMessage()]
    assert len(registered) == 1  # one connection all along
    assert (d / "node.pem").read_bytes() == first


async def test_an_expired_certificate_is_said_once_and_not_sent(
    cluster: Cluster,
    tmp_path: Path,
    running: Callable[[Link], None],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llmgw_agentd import link as link_module

    monkeypatch.setattr(link_module, "MAX_BACKOFF_S", 0.02)
    caplog.set_level(logging.DEBUG, "llmgw_agentd.link")
    d = await joined(cluster, tmp_path, "n1")
    clock = WallClock()
    clock.now += 31 * DAY_S
    ln = link(cluster, Agent(), d, "n1", clock)
    running(ln)

    def said() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "certificate expired" in r.getMessage()]

    await eventually(lambda: len(said()) >= 3)
    assert [r.levelno for r in said()].count(logging.WARNING) == 1
    assert "llmgw node remove" in ln.refused
    assert cluster.state.known() == []


async def test_a_node_that_joined_before_membership_records_is_adopted_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    d = node_dir(tmp_path, cluster.ca, "old-node")  # a certificate without a record
    cluster.state.set_desired("old-node", [])
    assert isinstance(await first_message(cluster, d, "old-node"), wire.Desired)
    member = await cluster.members.get("old-node")
    assert member is not None and member.serials == [pki.serial_of((d / "node.pem").read_bytes())]
    # Its name is now a member's: no token takes it.
    token = pki.new_join_token(cluster.ca.cert_pem)
    cluster.tokens.add(token)
    with pytest.raises(JoinError, match="member"):
        await join(cluster.url, token, "old-node", tmp_path / "thief")


async def renewal_over_a_link(
    c: Cluster, d: Path, csr_pem: str, caplog: pytest.LogCaptureFixture, said: str
) -> bool:
    """Send a Renew over the node's own link; once the control plane has said `said`, whether
    the link is still up."""
    async with (
        aiohttp.ClientSession() as s,
        s.ws_connect(f"{c.url}/agent", ssl=link_ssl_context(d)) as ws,
    ):
        await ws.send_bytes(register("n1"))
        assert isinstance(wire.decode_server((await ws.receive(timeout=5)).data), wire.Desired)
        await ws.send_bytes(wire.encode(wire.Renew(csr_pem=csr_pem)))
        await eventually(lambda: any(said in r.getMessage() for r in caplog.records))
        return c.state.connected() == ["n1"] and not ws.closed


async def test_a_renewal_csr_for_another_key_is_refused_and_the_link_kept(
    cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = await joined(cluster, tmp_path, "n1")
    cluster.state.set_desired("n1", [])
    _, other = pki.make_node_csr("n1")  # the node's name, but not its key
    said = "renewal refused: the CSR is not for this node's key"
    assert await renewal_over_a_link(cluster, d, other.decode(), caplog, said)
    member = await cluster.members.get("n1")
    assert member is not None and member.serials == [pki.serial_of((d / "node.pem").read_bytes())]


async def test_a_store_failing_a_renewal_keeps_the_link(
    cluster: Cluster,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = await joined(cluster, tmp_path, "n1")
    cluster.state.set_desired("n1", [])

    async def fails(*_: object) -> None:
        raise OSError("disk I/O error")

    monkeypatch.setattr(SqliteStore, "txn", fails)
    csr = renew.request(d, "n1").csr_pem
    said = "renewal not recorded, the store failed (OSError)"
    assert await renewal_over_a_link(cluster, d, csr, caplog, said)
    assert not [r for r in caplog.records if r.exc_info]  # no traceback
    monkeypatch.undo()
    # The node still holds a certificate the cluster takes.
    assert isinstance(await first_message(cluster, d, "n1"), wire.Desired)


async def test_renewals_whose_answers_were_lost_leave_the_current_certificate_valid() -> None:
    store = await SqliteStore.open(":memory:")
    try:
        m = Members(store)
        assert await m.admit("n1", "s0")
        # Two Renewed answers never reached the node (a link flap, a crash before the write):
        # it still connects with s0.
        assert await m.renewed("n1", "s0", "s1")
        assert await m.renewed("n1", "s0", "s2")
        assert refusal(await m.get("n1"), "s0") is None
        assert refusal(await m.get("n1"), "s2") is None
        await m.used("n1", "s2")  # once the newest is used, the older die
        assert refusal(await m.get("n1"), "s0") is not None
    finally:
        await store.close()
