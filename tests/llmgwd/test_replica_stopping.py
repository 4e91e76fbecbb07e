"""A replica its agent reports "stopping" (told to stop, its unit not gone yet): out of the
router's pool, and its node still counts as running llmgw's engines (a lend waits for it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmgw import wire
from llmgw_agentd.link import Link
from llmgwd.slurm.task import with_replicas
from tests.llmgwd.test_cluster import SPEC, Agent, Cluster, cluster, eventually, node_dir, running

__all__ = ["cluster", "running"]  # the fixtures, used by name


def reported(c: Cluster, state: str) -> bool:
    node = c.state.node("n1")
    return node is not None and [r.state for r in node.replicas] == [state]


async def test_a_node_holds_llmgws_engines_until_the_stopping_one_is_gone(
    cluster: Cluster, tmp_path: Path, running: Callable[[Link], None]
) -> None:
    agent = Agent()
    cluster.state.set_desired("n1", [])  # nothing placed there any more
    running(agent.link(cluster, node_dir(tmp_path, cluster.ca, "n1"), "n1"))
    await eventually(lambda: cluster.state.connected() == ["n1"])
    # Its agent still stops the engine (one that does not obey SIGTERM at once).
    agent.statuses = [wire.ReplicaStatus(id="smol-1", model="smol", state="stopping", port=1)]
    await eventually(lambda: reported(cluster, "stopping"))
    assert with_replicas(cluster.state.nodes(), []) == {"n1"}  # a lend waits: not lent yet
    agent.statuses = []  # the unit is gone
    await eventually(lambda: cluster.state.node("n1").replicas == ())  # type: ignore[union-attr]
    assert with_replicas(cluster.state.nodes(), []) == set()


async def test_a_stopping_replica_takes_no_new_request(
    cluster: Cluster, tmp_path: Path, running: Callable[[Link], None]
) -> None:
    state, agent = cluster.state, Agent()
    state.set_desired("n1", [SPEC])  # its spec changed: the same replica restarted
    agent.statuses = [wire.ReplicaStatus(id="smol-1", model="smol", state="ready", port=20001)]
    running(agent.link(cluster, node_dir(tmp_path, cluster.ca, "n1"), "n1"))
    await eventually(lambda: state.ready("smol"))
    agent.statuses = [wire.ReplicaStatus(id="smol-1", model="smol", state="stopping", port=20001)]
    await eventually(lambda: reported(cluster, "stopping"))
    assert state.ready("smol") == []


def test_an_older_control_plane_hears_stopped(tmp_path: Path) -> None:
    """One whose Desired does not say it takes "stopping" would refuse the message."""
    statuses = [wire.ReplicaStatus(id="r1", model="m", state="stopping")]
    link = Link("https://127.0.0.1:1", tmp_path, "n1", version="t",
                inventory=lambda: wire.Inventory(cores=1, memory_bytes=1, memory_free_bytes=1),
                replicas=lambda: statuses, on_desired=Agent().on_desired)  # fmt: skip
    assert [s.state for s in link._statuses()] == ["stopped"]
