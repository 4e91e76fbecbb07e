"""llmgw upgrade's control-plane side over a real store: packages staged (read from their own
headers, kept in the mirror's blob store), a roll started, driven by the leader's passes (the
agents told in order, their reports and releases applied), halted by a failure, resumed,
aborted; a new leader's driver carries the stored roll on."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import msgspec
import pytest

from llmgw import wire
from llmgw.blobstore import BlobStore
from llmgwd.api.access import peercred_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog
from llmgwd.mirror.service import Mirror
from llmgwd.nodes import members
from llmgwd.nodes.state import ClusterState
from llmgwd.planes import registry
from llmgwd.store.sqlite import SqliteStore
from llmgwd.upgrade.driver import Driver
from tests.llmgw.test_packages import make_deb
from tests.llmgwd.test_api import FakeNodes, Tokens, call, node, serve

OLD, NEW = "0.1.0", "0.2.0"


class FakeCluster:
    """The leader's ClusterState as the driver sees it: agents' releases, Upgrades sent."""

    def __init__(self, names: list[str]) -> None:
        self.versions = dict.fromkeys(names, OLD)
        self.sent: list[tuple[str, wire.Upgrade]] = []
        self.upgrade_reports: dict[str, wire.UpgradeReport] = {}
        self.refuse: dict[str, str] = {}
        self.addresses: dict[str, str] = {}

    def nodes(self) -> list[Any]:
        return [_Node(n, v, address=self.addresses.get(n, "")) for n, v in self.versions.items()]

    def node(self, name: str) -> Any:
        return _Node(name, self.versions[name]) if name in self.versions else None

    def send_upgrade(self, name: str, msg: wire.Upgrade) -> str:
        if name in self.refuse:
            return self.refuse[name]
        self.sent.append((name, msg))
        return ""


class _Node(msgspec.Struct):
    name: str
    version: str
    connected: bool = True
    address: str = ""


class Cluster:
    def __init__(self, tmp: Path, store: SqliteStore, client: aiohttp.ClientSession) -> None:
        self.tmp, self.store, self.client = tmp, store, client
        self.agents = FakeCluster(["p1", "p2", "n1", "n2", "n3"])
        self.driver = Driver(store, cast(ClusterState, self.agents), clock=self.clock)
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    async def planes(self, leader: str, versions: dict[str, str]) -> None:
        for name, version in versions.items():
            role: wire.PlaneRole = "leader" if name == leader else "standby"
            info = wire.PlaneInfo(name, f"https://{name}:7710", role=role, version=version)
            await self.store.put(registry.SERVERS + name, msgspec.json.encode(info))

    async def stage(self, name: str, version: str = NEW) -> tuple[int, Any]:
        deb = make_deb(self.tmp / f"{name}.deb", name, version)
        data = deb.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        async with self.client.put(f"/api/v1/upgrade/packages/{sha}", data=data) as resp:
            return resp.status, await resp.json()

    async def tick(self, **versions: str) -> dict[str, Any]:
        self.agents.versions |= versions
        self.now += 2.0
        await self.driver.tick()
        _, view = await call(self.client, "GET", "/upgrade")
        return cast(dict[str, Any], view["roll"])

    def report(self, name: str, step: wire.UpgradeStep, message: str = "") -> None:
        msg = [m for n, m in self.agents.sent if n == name][-1]
        report = wire.UpgradeReport(msg.roll, msg.attempt, step, 1, 2, message)
        self.agents.upgrade_reports[name] = report


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    nodes = FakeNodes()
    nodes.items = [node(n) for n in ("p1", "n1", "n2", "n3")]
    # the handlers use the mirror's blob store only
    mirror = cast(Mirror, type("M", (), {"store": BlobStore(tmp_path / "mirror"), "fleet": None})())
    ctx = ApiContext(catalog=catalog, nodes=nodes, mint_token=Tokens(), join_url="", mirror=mirror)
    async with serve(api_app(ctx, peercred_auth("llmgw")), tmp_path / "d.sock") as client:
        c = Cluster(tmp_path, store, client)
        await c.planes("p1", {"p1": OLD, "p2": OLD})
        yield c
    await store.close()


def steps(roll: dict[str, Any]) -> dict[str, str]:
    return {h["name"]: h["step"] for h in roll["hosts"]}


async def test_stage_reads_the_package_and_keeps_it_by_sha256(cluster: Cluster) -> None:
    status, staged = await cluster.stage("llmgw-agentd")
    assert status == 201, staged
    assert (staged["name"], staged["version"], staged["release"]) == ("llmgw-agentd", NEW, NEW)
    assert staged["filename"] == f"llmgw-agentd_{NEW}_amd64.deb"
    assert BlobStore(cluster.tmp / "mirror").has(staged["sha256"])
    _, view = await call(cluster.client, "GET", "/upgrade")
    assert [p["name"] for p in view["staged"]] == ["llmgw-agentd"] and view["roll"] is None
    status, answer = await cluster.stage("not-ours")
    assert status == 400 and "not-ours is not one of llmgw, llmgw-agentd, llmgwd" in str(answer)


async def test_a_roll_goes_plane_by_plane_leader_last_then_nodes(cluster: Cluster) -> None:
    await cluster.stage("llmgw-agentd")
    await cluster.stage("llmgwd")
    status, roll = await call(cluster.client, "POST", "/upgrade/start",
                              {"parallel": 2, "nodes": ["n1", "n2", "n3"]})  # fmt: skip
    assert status == 200, roll
    assert [h["name"] for h in roll["hosts"]] == ["p1", "p2", "n1", "n2", "n3"]
    roll = await cluster.tick()
    assert [n for n, _ in cluster.agents.sent] == ["p2"]  # a standby first
    _, msg = cluster.agents.sent[0]
    assert msg.release == NEW and {p.name for p in msg.packages} == {"llmgw-agentd", "llmgwd"}
    cluster.report("p2", "fetching")
    roll = await cluster.tick()
    p2 = roll["hosts"][1]
    assert (p2["step"], p2["done_bytes"], p2["total_bytes"]) == ("fetching", 1, 2)
    await cluster.planes("p1", {"p1": OLD, "p2": NEW})  # its llmgwd back on the release
    roll = await cluster.tick()
    assert steps(roll)["p2"] == "fetching"  # its agent not back on it yet
    roll = await cluster.tick(p2=NEW)
    assert steps(roll)["p2"] == "done" and [n for n, _ in cluster.agents.sent] == ["p2", "p1"]
    await cluster.planes("p2", {"p1": NEW, "p2": NEW})  # the leader's host last
    roll = await cluster.tick(p1=NEW)
    assert [n for n, _ in cluster.agents.sent][2:] == ["n1", "n2"]  # two at once
    roll = await cluster.tick(n1=NEW)
    assert [n for n, _ in cluster.agents.sent][4:] == ["n3"]
    roll = await cluster.tick(n2=NEW, n3=NEW)
    assert roll["state"] == "done" and set(steps(roll).values()) == {"done"}


async def test_a_failure_halts_and_says_why_resume_and_abort(cluster: Cluster) -> None:
    await cluster.stage("llmgw-agentd")
    await call(cluster.client, "POST", "/upgrade/start", {"nodes": []})
    await cluster.tick()
    cluster.report("p2", "failed", "llmgw-upgrade-x-1.service: exited with status 100")
    roll = await cluster.tick()
    assert roll["state"] == "halted"
    assert roll["error"] == "p2: llmgw-upgrade-x-1.service: exited with status 100"
    await cluster.tick()
    assert len(cluster.agents.sent) == 1  # nothing else started
    status, answer = await call(cluster.client, "POST", "/upgrade/start", {})
    assert status == 409 and "resume or abort it" in answer["error"]["message"]
    status, roll = await call(cluster.client, "POST", "/upgrade/resume")
    assert status == 200 and roll["state"] == "running"
    await cluster.tick()
    assert [(n, m.attempt) for n, m in cluster.agents.sent] == [("p2", 1), ("p2", 2)]
    status, roll = await call(cluster.client, "POST", "/upgrade/abort")
    assert roll["state"] == "aborted"
    await cluster.planes("p1", {"p1": OLD, "p2": NEW})
    roll = await cluster.tick(p2=NEW)
    assert steps(roll) == {"p1": "waiting", "p2": "done"}  # p2 finished; p1 never started
    assert len(cluster.agents.sent) == 2


async def test_a_plane_host_without_an_agent_fails_saying_so(cluster: Cluster) -> None:
    await cluster.stage("llmgwd")
    await call(cluster.client, "POST", "/upgrade/start", {"nodes": []})
    del cluster.agents.versions["p2"]
    cluster.agents.refuse["p2"] = "its agent is not connected"
    roll = await cluster.tick()
    assert roll["state"] == "halted"
    assert "a control plane's host is upgraded through its agent" in roll["error"]


async def test_a_new_leader_carries_the_stored_roll_on(cluster: Cluster) -> None:
    await cluster.stage("llmgw-agentd")
    await call(cluster.client, "POST", "/upgrade/start", {"nodes": ["n1"]})
    await cluster.tick()
    await cluster.planes("p1", {"p1": OLD, "p2": NEW})
    # the old leader is gone; another process's driver reads the roll from the store
    cluster.driver = Driver(cluster.store, cast(ClusterState, cluster.agents), clock=cluster.clock)
    roll = await cluster.tick(p2=NEW)
    assert steps(roll) == {"p2": "done", "p1": "fetching", "n1": "waiting"}


async def test_a_standby_plans_the_nodes_the_store_knows(cluster: Cluster) -> None:
    """A standby's cluster state holds no agents: the members recorded in the store count."""
    for name, removed in (("n9", False), ("gone", True)):
        member = members.Member(name=name, serials=["1"], removed=removed)
        await cluster.store.put(members.NODES + name, msgspec.json.encode(member))
    await cluster.stage("llmgw")
    _, roll = await call(cluster.client, "POST", "/upgrade/start", {})
    assert [h["name"] for h in roll["hosts"]] == ["p1", "p2", "n1", "n2", "n3", "n9"]


async def test_a_plane_named_by_its_address_is_upgraded_through_that_hosts_agent(
    cluster: Cluster,
) -> None:
    """A control plane is named by its advertised host (an address, say); its host's agent by
    the host's name: the Upgrade goes to the node at that address, whose reports are the
    plane's, and the node is then done as already on the release."""
    await cluster.store.delete(registry.SERVERS + "p2")
    await cluster.store.delete(registry.SERVERS + "p1")
    await cluster.planes("10.0.0.9", {"10.0.0.9": OLD})
    cluster.agents.versions["vm"] = OLD
    cluster.agents.addresses["vm"] = "10.0.0.9"
    await cluster.stage("llmgwd")
    _, roll = await call(cluster.client, "POST", "/upgrade/start", {"nodes": ["n1"]})
    roll = await cluster.tick()
    assert [n for n, _ in cluster.agents.sent] == ["vm"]
    assert roll["hosts"][0]["agent"] == "vm"
    cluster.report("vm", "installing")
    roll = await cluster.tick()
    assert steps(roll) == {"10.0.0.9": "installing", "n1": "waiting"}
    await cluster.planes("10.0.0.9", {"10.0.0.9": NEW})
    roll = await cluster.tick(vm=NEW)
    # restarted onto it by the packages' scripts, but dpkg not through: not done yet
    assert steps(roll) == {"10.0.0.9": "installing", "n1": "waiting"}
    cluster.report("vm", "restarting")  # the new agent: the install unit ended well
    roll = await cluster.tick()
    assert steps(roll) == {"10.0.0.9": "done", "n1": "fetching"}


async def test_a_host_in_flight_whose_agent_is_away_is_told_again_when_back(
    cluster: Cluster,
) -> None:
    """The packages' scripts restart the agent: while it is away the host stays in its step
    (no failure), and once back it is told the same try again."""
    await cluster.stage("llmgw-agentd")
    await call(cluster.client, "POST", "/upgrade/start", {"nodes": []})
    await cluster.tick()
    cluster.agents.refuse["p2"] = "its agent is not connected"
    cluster.now += 20
    roll = await cluster.tick()
    assert steps(roll)["p2"] == "fetching" and roll["state"] == "running"
    del cluster.agents.refuse["p2"]
    await cluster.tick()
    assert [(n, m.attempt) for n, m in cluster.agents.sent] == [("p2", 1), ("p2", 1)]


async def test_a_mirror_sweep_keeps_the_staged_packages(cluster: Cluster) -> None:
    """No model uses a package's file, yet the nodes fetch it from the mirror."""
    _, staged = await cluster.stage("llmgw")
    mirror = BlobStore(cluster.tmp / "mirror")
    mirror.ingest(make_deb(cluster.tmp / "other.deb", "stray", "1"))  # used by nothing
    status, out = await call(cluster.client, "POST", "/mirror/sweep", {"dry_run": False})
    assert status == 200 and out["files"] == 1, out
    assert [h.sha256 for h in mirror.held()] == [staged["sha256"]]


async def test_a_roll_from_the_repositories_stages_nothing_and_names_the_version(
    cluster: Cluster,
) -> None:
    status, answer = await call(cluster.client, "POST", "/upgrade/start",
                                {"from_repositories": True})  # fmt: skip
    assert status == 400 and "name the version" in answer["error"]["message"]
    for bad in ("1.0; rm -rf /", "--foo", "1.0 x", "-1", "1.0=2"):
        status, answer = await call(cluster.client, "POST", "/upgrade/start",
                                    {"from_repositories": True, "release": bad})  # fmt: skip
        assert status == 400 and "not a package version" in answer["error"]["message"], bad
    body = {"from_repositories": True, "release": NEW, "nodes": ["n1"]}
    status, roll = await call(cluster.client, "POST", "/upgrade/start", body)
    assert status == 200, roll
    assert roll["from_repositories"] is True and roll["release"] == NEW
    await cluster.tick()
    [(name, msg)] = cluster.agents.sent
    assert name == "p2" and msg.from_repositories and msg.packages == [] and msg.release == NEW
    cluster.report("p2", "installing", "llmgw-agentd=0.2.0")
    await cluster.planes("p1", {"p1": OLD, "p2": NEW})
    cluster.report("p2", "restarting")
    roll = await cluster.tick(p2=NEW)
    assert steps(roll)["p2"] == "done"


async def test_a_repository_version_with_an_epoch_and_revision_is_done_on_its_release(
    cluster: Cluster,
) -> None:
    body = {"from_repositories": True, "release": "1:0.2.0~rc1-1", "nodes": []}
    status, roll = await call(cluster.client, "POST", "/upgrade/start", body)
    assert status == 200, roll
    assert (roll["release"], roll["version"]) == ("0.2.0rc1", "1:0.2.0~rc1-1")
    await cluster.tick()
    [(_, msg)] = cluster.agents.sent
    assert (msg.release, msg.version) == ("0.2.0rc1", "1:0.2.0~rc1-1")
    await cluster.planes("p1", {"p1": OLD, "p2": "0.2.0rc1"})
    cluster.report("p2", "restarting")
    roll = await cluster.tick(p2="0.2.0rc1")  # what its agent says once on it
    assert steps(roll)["p2"] == "done"


async def test_an_agent_that_cannot_install_from_the_repositories_halts_the_roll(
    cluster: Cluster,
) -> None:
    await call(cluster.client, "POST", "/upgrade/start",
               {"from_repositories": True, "release": NEW, "nodes": []})  # fmt: skip
    cluster.agents.refuse["p2"] = "its llmgw-agentd 0.1.0 cannot install from the repositories"
    roll = await cluster.tick()
    assert roll["state"] == "halted"
    assert roll["error"].startswith("p2: its llmgw-agentd 0.1.0 cannot install from the")
