"""The leader's Slurm task: each node's part from the settings and the nodes' reports, the kept
list saved in the leader's term (a new leader writes the same slurm.conf), and the nodes held
from the scheduler while lent."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from llmgw.wire import Inventory, ReplicaStatus, SlurmPart, SlurmReport
from llmgwd.nodes.members import Members
from llmgwd.placement.reconciler import NodeFlags
from llmgwd.placement.scheduler import Placement
from llmgwd.planes.fence import FencedStore
from llmgwd.planes.leader import LEADER
from llmgwd.slurm import kept
from llmgwd.slurm.munge import munge_key
from llmgwd.slurm.settings import SETTINGS, SlurmSettings
from llmgwd.slurm.task import SlurmTask
from llmgwd.store.sqlite import SqliteStore

RECORDED = (Path(__file__).parent / "recorded" / "slurmd-C.txt").read_text().splitlines()
LINE = next(line for line in RECORDED if line.startswith("NodeName="))
SECRET = b"s" * 32


@dataclass
class Node:
    name: str
    address: str
    inventory: Inventory
    replicas: list[ReplicaStatus] = field(default_factory=list)


def node(name: str, address: str, state: str = "drained", jobs: list[str] | None = None) -> Node:
    report = SlurmReport(version="22.05.8", node_line=LINE, state=state, jobs=jobs or [])
    return Node(name, address, Inventory(cores=2, memory_bytes=1 << 30, memory_free_bytes=0,
                                         slurm=report))  # fmt: skip


class Cluster:
    def __init__(self, *nodes: Node) -> None:
        self.list = list(nodes)
        self.parts: dict[str, SlurmPart | None] = {}
        self.untold: set[str] = set()  # told nothing of Slurm: they keep what they run
        self.loaded = False  # the task said its parts are set (Desired no longer pending)

    def nodes(self) -> list[Node]:
        return self.list

    def set_slurm(self, node: str, part: SlurmPart | None) -> None:
        self.parts[node] = part
        self.untold.discard(node)

    def slurm_untold(self, node: str) -> None:
        self.parts.pop(node, None)
        self.untold.add(node)

    def slurm_loaded(self) -> None:
        self.loaded = True


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(":memory:")
    yield s
    await s.close()


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _task(
    store: SqliteStore,
    cluster: Cluster,
    placed: list[Placement] | None = None,
    clock: Clock | None = None,
) -> tuple[SlurmTask, list[Mapping[str, NodeFlags]]]:
    term = await store.put(LEADER, b"me")
    held: list[Mapping[str, NodeFlags]] = []
    task = SlurmTask(store, FencedStore(store, term, lambda _: None), cluster, SECRET,
                     lambda: placed or [], held.append,
                     hold_s=30, clock=clock or Clock())  # fmt: skip
    return task, held


async def _set(store: SqliteStore, s: SlurmSettings) -> None:
    await store.put(SETTINGS, msgspec.json.encode(s))


ON = SlurmSettings(enabled=True, controller="cp", nodes=["n1", "n2"])


async def test_slurm_off_gives_no_node_a_part(store: SqliteStore) -> None:
    cluster = Cluster(node("cp", "10.0.0.1"), node("n1", "10.0.0.2"))
    task, held = await _task(store, cluster)

    await task.step()

    assert cluster.parts == {"cp": None, "n1": None}
    assert held == [{}]


async def test_each_node_gets_its_part_and_the_controller_its_files(store: SqliteStore) -> None:
    cluster = Cluster(node("cp", "10.0.0.1"), node("n1", "10.0.0.2"), node("n2", "10.0.0.3"))
    await _set(store, ON)
    task, _ = await _task(store, cluster)

    await task.step()

    cp, n1 = cluster.parts["cp"], cluster.parts["n1"]
    assert cp is not None and n1 is not None
    assert (cp.slurmctld, cp.slurmd, n1.slurmd, n1.slurmctld) == (True, False, True, False)
    assert n1.conf_server == cp.conf_server == "10.0.0.1:6817"
    assert base64.b64decode(n1.munge_key) == munge_key(SECRET)
    assert "NodeName=n1 NodeAddr=10.0.0.2" in cp.slurm_conf
    assert "SlurmctldHost=cp(10.0.0.1)" in cp.slurm_conf
    assert n1.conf_hash == cp.conf_hash != "" and n1.slurm_conf == ""
    assert "CgroupPlugin=cgroup/v2" in cp.cgroup_conf
    assert [n.name for n in (await kept.load(store)).nodes] == ["n1", "n2"]
    # Slurm's ports are opened to the cluster's Slurm hosts alone, on every node.
    assert n1.peers == cp.peers == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


async def test_a_lent_node_reaches_slurm_only_once_its_replicas_are_gone(
    store: SqliteStore,
) -> None:
    n1 = node("n1", "10.0.0.2")
    n1.replicas = [ReplicaStatus(id="r1", model="m", state="ready")]
    cluster = Cluster(node("cp", "10.0.0.1"), n1, node("n2", "10.0.0.3"))
    await _set(store, SlurmSettings(enabled=True, controller="cp", nodes=["n1", "n2"],
                                    lent=["n1"]))  # fmt: skip
    task, held = await _task(store, cluster)

    await task.step()
    cp = cluster.parts["cp"]
    assert cp is not None and cp.lent == []
    assert held[-1] == {"n1": NodeFlags(cordoned=True, draining=True)}
    assert [s.status for s in task.status()][:2] == ["in llmgw", "lending: moving replicas"]

    n1.replicas = []
    await task.step()
    cp = cluster.parts["cp"]
    assert cp is not None and cp.lent == ["n1"]
    assert held[-1] == {"n1": NodeFlags(cordoned=True, draining=True)}


async def test_a_new_leader_changes_no_part_until_it_has_heard_the_nodes(
    store: SqliteStore,
) -> None:
    cluster = Cluster(node("cp", "10.0.0.1"), node("n1", "10.0.0.2"), node("n2", "10.0.0.3"))
    await _set(store, SlurmSettings(enabled=True, controller="cp", nodes=["n1", "n2"],
                                    lent=["n1"]))  # fmt: skip
    first, _ = await _task(store, cluster)
    await first.step()
    before = cluster.parts["cp"]
    assert before is not None and before.lent == ["n1"] and cluster.loaded

    # The next leader: only the controller has registered yet. It tells no node anything
    # of Slurm (its Desired stays pending), and holds the silent nodes from the scheduler.
    clock = Clock()
    again = Cluster(node("cp", "10.0.0.1"))
    second, held = await _task(store, again, clock=clock)
    await second.start()
    assert again.parts == {} and not again.loaded
    assert held[-1] == {"n1": NodeFlags(cordoned=True, draining=True),
                        "n2": NodeFlags(cordoned=True)}  # fmt: skip

    # Every node heard: the same files, n1 still lent (it was never drained meanwhile).
    again.list += [node("n1", "10.0.0.2", state="allocated", jobs=["5"]), node("n2", "10.0.0.3")]
    await second.step()
    assert again.parts["cp"] == before and again.loaded


async def test_a_node_silent_past_the_hold_keeps_what_it_runs(store: SqliteStore) -> None:
    cluster = Cluster(node("cp", "10.0.0.1"), node("n1", "10.0.0.2"), node("n2", "10.0.0.3"))
    await _set(store, ON)
    first, _ = await _task(store, cluster)
    await first.step()
    before = cluster.parts["cp"]

    clock = Clock()
    again = Cluster(node("cp", "10.0.0.1"), node("n1", "10.0.0.2"))  # n2 silent
    second, held = await _task(store, again, clock=clock)
    await second.step()
    clock.now += 29
    await second.step()
    assert again.parts == {}
    clock.now += 1  # hold_s
    await second.step()

    after = again.parts["cp"]
    assert before is not None and after is not None
    assert after.slurm_conf == before.slurm_conf  # n2 still listed: it may run a job
    assert set(again.parts) == {"cp", "n1"}  # n2 is told nothing until it registers
    assert held[-1] == {"n2": NodeFlags(cordoned=True)}


async def test_a_node_dropped_from_slurm_with_a_job_stays_listed(store: SqliteStore) -> None:
    busy = node("n2", "10.0.0.3", state="draining")
    cluster = Cluster(node("cp", "10.0.0.1"), node("n1", "10.0.0.2"), busy)
    await _set(store, ON)
    task, _ = await _task(store, cluster)
    await task.step()

    busy.inventory = node("n2", "10.0.0.3", state="draining", jobs=["9"]).inventory
    await _set(store, SlurmSettings(enabled=True, controller="cp", nodes=["n1"]))
    await task.step()

    cp, n2 = cluster.parts["cp"], cluster.parts["n2"]
    assert cp is not None and "NodeName=n2" in cp.slurm_conf
    assert n2 is not None and n2.slurmd  # its slurmd keeps running while the job does


async def test_with_no_controller_known_the_nodes_are_told_nothing(store: SqliteStore) -> None:
    # Slurm on, its controller never heard from and nothing kept: "no part" would stop
    # slurmd on n1 and n2 (and their jobs); they are told nothing and keep what they run.
    cluster = Cluster(node("n1", "10.0.0.2", state="allocated", jobs=["7"]), node("n2", "10.0.0.3"))
    await _set(store, ON)
    clock = Clock()
    task, _ = await _task(store, cluster, clock=clock)
    clock.now += 120  # past the hold (slurm.hold_for: nothing is kept)
    await task.step()

    assert cluster.parts == {} and cluster.untold == {"n1", "n2"} and cluster.loaded

    # The controller registers: every node gets its part.
    cluster.list.append(node("cp", "10.0.0.1"))
    await task.step()
    n1 = cluster.parts["n1"]
    assert n1 is not None and n1.slurmd and n1.conf_server == "10.0.0.1:6817"
    assert cluster.untold == set()


async def test_a_new_leader_with_nothing_kept_waits_hold_for_for_the_nodes(
    store: SqliteStore,
) -> None:
    # No kept list (a cluster upgraded to it, or the store lost it): a slurm.conf written
    # before n2 reports would leave n2 out, and slurmctld would fail the job running there.
    await _set(store, SlurmSettings(enabled=True, controller="cp", nodes=["n1", "n2"],
                                    hold_for_s=120))  # fmt: skip
    clock = Clock()
    cluster = Cluster(node("cp", "10.0.0.1"), node("n1", "10.0.0.2"))  # n2 not heard yet
    task, _ = await _task(store, cluster, clock=clock)
    await task.start()
    clock.now += 119  # past the kept list's hold (30 s), within slurm.hold_for
    await task.step()
    assert cluster.parts == {} and not cluster.loaded
    assert (await kept.load(store)).nodes == []

    cluster.list.append(node("n2", "10.0.0.3", state="allocated", jobs=["3"]))
    await task.step()
    cp = cluster.parts["cp"]
    assert cp is not None and "NodeName=n2 " in cp.slurm_conf and cluster.loaded


async def test_slurm_hold_for_passed_the_parts_are_set_without_the_silent(
    store: SqliteStore,
) -> None:
    await _set(store, SlurmSettings(enabled=True, controller="cp", nodes=["n1", "n2"],
                                    hold_for_s=60))  # fmt: skip
    clock = Clock()
    cluster = Cluster(node("cp", "10.0.0.1"), node("n1", "10.0.0.2"))
    task, _ = await _task(store, cluster, clock=clock)
    await task.step()
    clock.now += 59
    await task.step()
    assert cluster.parts == {}
    clock.now += 1
    await task.step()
    cp = cluster.parts["cp"]
    assert cp is not None and "NodeName=n1 " in cp.slurm_conf
    assert "NodeName=n2" not in cp.slurm_conf  # its hardware is not known: not listed yet


async def test_all_nodes_gives_every_node_a_slurmd_those_joining_later_too(
    store: SqliteStore,
) -> None:
    for name in ("cp", "n1"):
        await Members(store).admit(name, "s-" + name)
    await _set(store, SlurmSettings(enabled=True, controller="cp", all_nodes=True))
    cluster = Cluster(node("cp", "10.0.0.1"), node("n1", "10.0.0.2"))
    task, _ = await _task(store, cluster)
    await task.step()
    cp, n1 = cluster.parts["cp"], cluster.parts["n1"]
    assert cp is not None and n1 is not None and cp.slurmd and cp.slurmctld and n1.slurmd
    assert "NodeName=n1 " in cp.slurm_conf and "NodeName=cp " in cp.slurm_conf

    # n3 joins the cluster after Slurm was set up: it is given a slurmd and listed.
    await Members(store).admit("n3", "s-n3")
    cluster.list.append(node("n3", "10.0.0.4"))
    await task.step()
    cp, n3 = cluster.parts["cp"], cluster.parts["n3"]
    assert n3 is not None and n3.slurmd and n3.conf_server == "10.0.0.1:6817"
    assert cp is not None and "NodeName=n3 NodeAddr=10.0.0.4" in cp.slurm_conf
    assert [n.name for n in (await kept.load(store)).nodes] == ["cp", "n1", "n3"]
