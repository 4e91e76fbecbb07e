"""Roles: two control planes over one store; only the leader reconciles and takes agents, the
standby says where the leader is, both are recorded under /servers, and the standby takes
over when the leader dies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from llmgw import wire
from llmgw.errors import ApiError
from llmgwd.catalog import Catalog
from llmgwd.nodes import state as cluster
from llmgwd.nodes.agent_conn import AgentConn
from llmgwd.nodes.members import Members
from llmgwd.nodes.state import ClusterState
from llmgwd.placement.reconciler import NodeFlags
from llmgwd.planes import registry
from llmgwd.planes.leader import LEADER, Election, LeaderRecord
from llmgwd.planes.roles import Roles
from llmgwd.planes.session import Session
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.test_leader import eventually
from tests.llmgwd.test_standby import INVENTORY, FakeWs


@dataclass
class ControlPlane:
    name: str
    cluster: ClusterState
    roles: Roles
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://{self.name}:7710"

    async def kill(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def control_plane(store: SqliteStore, name: str) -> ControlPlane:
    url = f"https://{name}:7710"
    catalog = Catalog(store)
    await catalog.load()
    cluster = ClusterState(grace_s=30)
    session = Session(store, 1.0)
    announcer = registry.Announcer(store, name, url, lambda: session.lease)
    session._on_new = lambda _lease: announcer.renew()
    election = Election(store, session, LeaderRecord(name, url))
    roles = Roles(store, catalog, cluster, b"secret", election, announcer, grace_s=30)
    cp = ControlPlane(name, cluster, roles)
    for work in (session.run(), announcer.run(), election.run(roles.lead)):
        cp.tasks.append(asyncio.create_task(work))
    return cp


@pytest.fixture
async def two() -> AsyncIterator[tuple[SqliteStore, list[ControlPlane]]]:
    store = await SqliteStore.open(":memory:")
    cps = [await control_plane(store, "cp1"), await control_plane(store, "cp2")]
    yield store, cps
    for cp in cps:
        await cp.kill()
    await store.close()


async def test_only_the_leader_reconciles_and_takes_agents(
    two: tuple[SqliteStore, list[ControlPlane]],
) -> None:
    store, cps = two
    await eventually(lambda: sum(cp.roles.reconciler is not None for cp in cps) == 1)
    leader = next(cp for cp in cps if cp.roles.reconciler is not None)
    standby = next(cp for cp in cps if cp is not leader)
    assert leader.cluster.leading and not standby.cluster.leading
    await eventually(lambda: standby.cluster.leader_url == leader.url)

    async def recorded() -> dict[str, str]:
        found, _ = await registry.read(store)
        return {s.name: s.role for s in found}

    for _ in range(500):
        if await recorded() == {leader.name: "leader", standby.name: "standby"}:
            break
        await asyncio.sleep(0.01)
    assert await recorded() == {leader.name: "leader", standby.name: "standby"}

    with pytest.raises(ApiError, match=f"not the leader; the leader is {leader.url}"):
        await standby.roles.set_flags("n1", NodeFlags(cordoned=True))
    await leader.roles.set_flags("n1", NodeFlags(cordoned=True))  # through the fence

    await leader.kill()  # kill -9: nothing released, the lease runs out

    await eventually(lambda: standby.roles.reconciler is not None)
    assert standby.cluster.leading
    assert standby.roles.flags("n1") == NodeFlags(cordoned=True)  # loaded from the store


async def test_a_node_removed_through_a_standby_is_cut_off_by_the_leader(
    two: tuple[SqliteStore, list[ControlPlane]],
) -> None:
    """`llmgw node remove` asked of a standby revokes the node in the store; the leader, which
    holds the node's connection and places its replicas, must drop it too, and take it again
    once it joined again with a token (through any control plane)."""
    store, cps = two
    await eventually(lambda: sum(cp.roles.reconciler is not None for cp in cps) == 1)
    leader = next(cp for cp in cps if cp.roles.reconciler is not None)
    standby = next(cp for cp in cps if cp is not leader)
    members = Members(store)
    assert await members.admit("n1", "01")
    conn = AgentConn("n1", FakeWs(), "127.0.0.1", "01", b"")  # type: ignore[arg-type]
    await leader.cluster._attach(conn, wire.Register("n1", "127.0.0.1", "t", INVENTORY))
    assert leader.cluster.known() == ["n1"]

    assert await cluster.remove_node(standby.cluster, members, "n1")  # the standby's API

    await eventually(lambda: leader.cluster.known() == [] and leader.cluster.removed("n1"))
    assert await members.admit("n1", "02")  # a token join, answered by a standby
    await eventually(lambda: not leader.cluster.removed("n1"))


async def test_a_leader_write_fenced_off_is_a_503_not_leader(
    two: tuple[SqliteStore, list[ControlPlane]],
) -> None:
    """A cordon asked of a leader whose term has just ended in the store (paused past its
    lease, as the failover test does): the fence refuses the write, and the admin is told
    this control plane does not lead (a 503), not 'internal error' with a traceback logged."""
    store, cps = two
    await eventually(lambda: sum(cp.roles.reconciler is not None for cp in cps) == 1)
    leader = next(cp for cp in cps if cp.roles.reconciler is not None)
    await store.delete(LEADER)  # the term is over; this process has not seen it yet
    with pytest.raises(ApiError, match="not the leader") as e:
        await leader.roles.set_flags("n1", NodeFlags(cordoned=True))
    assert e.value.status == 503
    assert await store.get("/nodeflags/n1") is None
