"""The context of each ready replica reaches the router's pool: the engine's as its agent
reports it, else the one its spec was placed with (issue 9, finding 10)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import msgspec

from llmgw import wire
from llmgw_agentd.link import Link
from tests.llmgwd import test_cluster as base
from tests.llmgwd.test_cluster import SPEC, Agent, Cluster, eventually, node_dir

cluster, running = base.cluster, base.running  # their fixtures, for the tests here


def ready(context: int = 0) -> wire.ReplicaStatus:
    return wire.ReplicaStatus(id=SPEC.id, model="smol", state="ready", port=20001, context=context)


async def test_a_ready_replicas_context_reaches_the_pool(
    cluster: Cluster, tmp_path: Path, running: Callable[[Link], None]
) -> None:
    state, agent = cluster.state, Agent()
    state.set_desired("n1", [msgspec.structs.replace(SPEC, context=4096)])
    running(agent.link(cluster, node_dir(tmp_path, cluster.ca, "n1"), "n1"))
    await asyncio.wait_for(agent.desired.get(), 5)

    agent.statuses = [ready()]  # an agent older than the field: the spec's placed context
    await eventually(lambda: state.ready("smol"))
    assert [e.context for e in state.ready("smol")] == [4096]

    agent.statuses = [ready(context=2048)]  # what the engine said binds a request
    await eventually(lambda: [e.context for e in state.ready("smol")] == [2048])


async def test_no_context_anywhere_is_unknown(
    cluster: Cluster, tmp_path: Path, running: Callable[[Link], None]
) -> None:
    state, agent = cluster.state, Agent()
    state.set_desired("n1", [SPEC])  # the engine's default, and an agent that does not say
    agent.statuses = [ready()]
    running(agent.link(cluster, node_dir(tmp_path, cluster.ca, "n1"), "n1"))
    await eventually(lambda: state.ready("smol"))
    assert [e.context for e in state.ready("smol")] == [0]
