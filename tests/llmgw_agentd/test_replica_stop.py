"""A replica told to stop: reported "stopping" until its unit is gone, its requests in flight
finished first, and an engine deaf to SIGTERM killed after engines.stop_timeout_s."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

import aiohttp
import msgspec

from llmgw.config import AgentConfig, Engines
from llmgw.wire import ReplicaSpec, ReplicaStatus
from llmgw_agentd import engines
from tests.llmgw_agentd.test_replicas import KEY, Node, engine_command, node, ready, spec, until

__all__ = ["node"]  # the fixture, used by name

UNIT = "llmgw-engine-r1.service"


def with_args(*extra: str) -> Callable[[ReplicaSpec, str, int, str | None], list[str]]:
    def command(s: ReplicaSpec, host: str, port: int, key: str | None) -> list[str]:
        return [*engine_command(s, host, port, key), *extra]

    return command


def stopping(s: dict[str, ReplicaStatus]) -> bool:
    return "r1" in s and s["r1"].state == "stopping"


async def test_a_replica_is_reported_stopping_until_its_unit_is_gone(node: Node) -> None:
    node.config = msgspec.structs.replace(node.config, engines=Engines(stop_timeout_s=1.0))
    replicas = await node.new_replicas(with_args("--ignore-term"))
    await replicas.apply([spec()])
    await until(replicas, ready())
    stop = asyncio.create_task(replicas.apply([]))
    await until(replicas, stopping, within=2)
    # The unit still runs (its engine ignores SIGTERM): the node is not free yet.
    assert node.fake.units[UNIT].active_state in ("active", "deactivating")
    await stop
    assert replicas.statuses() == [] and UNIT not in node.fake.units


async def test_an_engine_deaf_to_sigterm_is_killed_after_the_setting(node: Node) -> None:
    node.config = msgspec.structs.replace(node.config, engines=Engines(stop_timeout_s=1.5))
    replicas = await node.new_replicas(with_args("--ignore-term"))
    await replicas.apply([spec()])
    await until(replicas, ready())
    props = node.fake.units[UNIT].properties
    assert props["TimeoutStopUSec"] == 1_500_000
    assert props["SendSIGKILL"] is True and props["FinalKillSignal"] == signal.SIGKILL
    assert props["KillMode"] == "mixed"  # SIGTERM to the engine, SIGKILL to the whole unit
    proc = node.fake.units[UNIT].proc
    assert proc is not None
    await asyncio.wait_for(replicas.apply([]), 10)
    assert proc.returncode == -signal.SIGKILL  # it ignored the SIGTERM: killed


def test_the_default_stop_timeout_is_well_under_30s() -> None:
    assert AgentConfig().engines.stop_timeout_s == 10.0


async def test_requests_in_flight_finish_before_the_engine_is_stopped(node: Node) -> None:
    replicas = await node.new_replicas(with_args("--answer-s", "1.0"))
    await replicas.apply([spec()])
    port = (await until(replicas, ready()))["r1"].port
    async with aiohttp.ClientSession() as http:
        chat = asyncio.create_task(
            http.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"messages": []},
                headers={"Authorization": f"Bearer {KEY}"},
            )
        )
        await asyncio.sleep(0.3)  # the chat is being answered
        await replicas.apply([])
        answer = await chat
        assert answer.status == 200  # finished, not cut by the engine's end
        assert (await answer.json())["choices"]
    assert UNIT not in node.fake.units


def test_the_requests_an_engine_holds_are_read_from_its_metrics() -> None:
    llama = spec()
    vllm = spec(engine="vllm")
    text = (
        "# HELP llamacpp:requests_processing Number of requests processing\n"
        "llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
    )
    assert engines.requests_held(llama, text) == 3
    assert engines.requests_held(vllm, text) == 4
    assert engines.requests_held(llama, "garbage\nllamacpp:requests_processing x\n") == 0
