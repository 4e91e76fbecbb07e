"""Agents and several control planes, over real TLS: a standby's cluster port tells an agent
where the leader is, the agent follows, keeps every control plane's URL, and finds the next
leader when the one it had stops leading."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import msgspec
import pytest

from llmgw import pki, wire
from llmgw_agentd.link import Link, link_ssl_context
from llmgw_agentd.planes import Planes
from llmgwd.nodes.members import Members
from llmgwd.nodes.state import ClusterState
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.test_cluster import (
    INVENTORY,
    SPEC,
    Agent,
    Cluster,
    eventually,
    node_dir,
    register,
)
from tests.llmgwd.test_cluster import running as running  # a fixture


@pytest.fixture
async def planes(tmp_path: Path) -> AsyncIterator[tuple[Cluster, Cluster]]:
    """Two control planes of one cluster (one CA, one store): a leader and a standby."""
    ca = pki.make_ca("test")
    pki.write_pair(pki.make_server_cert(ca), tmp_path / "s.pem", tmp_path / "s.key")
    store = await SqliteStore.open(":memory:")
    leader, standby = Cluster(ca, tmp_path, Members(store)), Cluster(ca, tmp_path, Members(store))
    await leader.start(ClusterState(grace_s=30, clock=leader.clock))
    await standby.start(ClusterState(grace_s=30, clock=standby.clock))
    standby.state.leading, standby.state.leader_url = False, leader.url
    yield leader, standby
    for c in (leader, standby):
        await c.runner.cleanup()
    await store.close()


async def test_a_standby_answers_an_agent_with_where_the_leader_is(
    planes: tuple[Cluster, Cluster], tmp_path: Path
) -> None:
    leader, standby = planes
    async with aiohttp.ClientSession() as s:
        ctx = link_ssl_context(node_dir(tmp_path, standby.ca, "n1"))
        async with s.ws_connect(f"{standby.url}/agent", ssl=ctx) as ws:
            await ws.send_bytes(register("n1"))
            msg = wire.decode_server((await ws.receive(timeout=5)).data)
    assert isinstance(msg, wire.Refused) and msg.standby and msg.leader == leader.url
    assert msg.reason == f"this control plane is not the leader; the leader is {leader.url}"
    assert standby.state.connected() == []


def agent_link(agent: Agent, first: Cluster, pki_dir: Path, planes_file: Path) -> Link:
    return Link(
        first.url,
        pki_dir,
        "n1",
        version="test",
        inventory=lambda: INVENTORY,
        replicas=lambda: agent.statuses,
        on_desired=agent.on_desired,
        heartbeat_s=0.05,
        planes=Planes(first.url, planes_file),
    )


async def test_an_agent_follows_the_standby_to_the_leader_and_keeps_every_url(
    planes: tuple[Cluster, Cluster], tmp_path: Path, running: Callable[[Link], None]
) -> None:
    leader, standby = planes
    leader.state.set_control_planes([leader.url, standby.url])
    leader.state.set_desired("n1", [SPEC])  # the list comes with the node's Desired
    agent, kept = Agent(), tmp_path / "control_planes.json"
    link = agent_link(agent, standby, node_dir(tmp_path, leader.ca, "n1"), kept)
    running(link)

    await eventually(lambda: leader.state.connected() == ["n1"])
    assert link.server == leader.url and link.refused == ""
    await eventually(kept.exists)
    assert sorted(msgspec.json.decode(kept.read_bytes(), type=list[str])) == sorted(
        [leader.url, standby.url]
    )


async def test_an_agent_finds_the_next_leader(
    planes: tuple[Cluster, Cluster], tmp_path: Path, running: Callable[[Link], None]
) -> None:
    old, new = planes
    old.state.set_control_planes([old.url, new.url])
    old.state.set_desired("n1", [SPEC])
    agent = Agent()
    link = agent_link(agent, old, node_dir(tmp_path, old.ca, "n1"), tmp_path / "planes.json")
    running(link)
    await eventually(lambda: old.state.connected() == ["n1"])
    await eventually(lambda: new.url in link._planes.urls)

    # The leadership moves: the old leader closes its agents, naming no leader yet (the
    # election is under way); the new one takes agents.
    new.state.leading = True
    old.state.stand_by("")

    await eventually(lambda: new.state.connected() == ["n1"])
    assert link.server == new.url
    assert old.state.connected() == [] and old.state.nodes() == []  # observed state forgotten


async def test_a_restarted_agent_reaches_the_control_planes_it_was_told_of(
    planes: tuple[Cluster, Cluster], tmp_path: Path, running: Callable[[Link], None]
) -> None:
    leader, standby = planes
    kept = tmp_path / "planes.json"
    pki.write_pem(kept, msgspec.json.encode([standby.url, leader.url]))
    await leader.runner.cleanup()  # the control plane it joined is gone for good
    gone = leader.url
    standby.state.leading = True
    agent = Agent()
    link = agent_link(agent, leader, node_dir(tmp_path, leader.ca, "n1"), kept)
    assert link.server == gone
    running(link)

    await eventually(lambda: standby.state.connected() == ["n1"])
    await asyncio.sleep(0)
    assert link.server == standby.url
