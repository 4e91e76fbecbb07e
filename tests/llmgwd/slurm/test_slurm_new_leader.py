"""A new leader's Desired over the real link: until its Slurm task has loaded what it kept
and set the parts, it says Slurm is pending and the agent keeps its part as it is (a
restarted llmgwd never tells a node "no part" for want of knowledge)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from llmgw import wire
from llmgw_agentd.link import Link
from tests.llmgwd.test_cluster import (  # noqa: F401 (cluster, running: the fixtures)
    INVENTORY,
    SPEC,
    Cluster,
    cluster,
    eventually,
    node_dir,
    running,
)

PART = wire.SlurmPart(slurmd=True, conf_server="10.0.0.9:6817", conf_hash="h1")


async def test_an_agent_hears_no_part_before_the_leader_has_loaded_slurm(
    cluster: Cluster,  # noqa: F811
    tmp_path: Path,
    running: Callable[[Link], None],  # noqa: F811
) -> None:
    told: list[wire.SlurmPart | None] = []
    desired: asyncio.Queue[list[wire.ReplicaSpec]] = asyncio.Queue()
    state = cluster.state  # a llmgwd just started: its Slurm task has not run yet
    state.set_desired("n1", [SPEC])
    link = Link(cluster.url, node_dir(tmp_path, cluster.ca, "n1"), "n1", version="test",
                inventory=lambda: INVENTORY, replicas=list, on_desired=desired.put,
                heartbeat_s=0.05, on_slurm=told.append)  # fmt: skip
    running(link)

    assert await asyncio.wait_for(desired.get(), 5) == [SPEC]
    assert told == []  # the replicas are told; Slurm is not: the node keeps what runs

    state.set_slurm("n1", PART)
    state.slurm_loaded()
    await eventually(lambda: told == [PART])

    # No controller known (slurm/task.py): the node is told nothing, not "no part" (which
    # would stop its slurmd); told again once there is something to tell.
    state.slurm_untold("n1")
    state.set_desired("n1", [])  # a Desired after it, to wait on
    while await asyncio.wait_for(desired.get(), 5) != []:
        pass
    assert told == [PART]  # that Desired said pending: no "no part"
    other = wire.SlurmPart(slurmd=True, conf_server="10.0.0.8:6817", conf_hash="h2")
    state.set_slurm("n1", other)
    await eventually(lambda: told[-1] == other)

    # Standing by ends the term: the next one is pending again until its task loads.
    state.stand_by("")
    assert state._slurm_loaded is False
