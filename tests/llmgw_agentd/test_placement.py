"""Each engine held to its placement: the unit's memory, CPUs and cards; OOM kills; readiness."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from llmgw import engine_memory
from llmgw.wire import ReplicaSpec
from llmgw_agentd import cpus, devices, oom
from llmgw_agentd.engines import EngineError, llamacpp
from llmgw_agentd.replicas import health_code
from tests.llmgw_agentd.fake_systemd import fake_systemd
from tests.llmgw_agentd.nvml_inventory import load, pascal, recorded
from tests.llmgw_agentd.test_replicas import (
    Node,
    engine_command,
    get,
    ready,
    spec,
    until,
)

UNIT = "llmgw-engine-r1.service"


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    """An agent's setup on a fake systemd (as test_replicas' own)."""
    async with fake_systemd(tmp_path) as (address, fake):
        n = Node(tmp_path, address, fake)
        try:
            yield n
        finally:
            for r in n.made:
                await r.close()


SHARED = [("/dev/nvidiactl", "rw"), ("/dev/nvidia-uvm", "rw"), ("/dev/nvidia-uvm-tools", "rw")]


def props(node: Node, unit: str = UNIT) -> dict[str, Any]:
    return node.fake.units[unit].properties


def allowed(node: Node, unit: str) -> list[int]:
    mask = bytes(props(node, unit)["AllowedCPUs"])
    return [i for i in range(len(mask) * 8) if mask[i // 8] >> (i % 8) & 1]


# Cards: DeviceAllow, DevicePolicy, CUDA_VISIBLE_DEVICES


async def test_an_engine_on_cards_may_open_only_its_cards(node: Node) -> None:
    node.inventory = recorded(load("dgx-h100-8x80gb"), toolkit="12.4")
    two, five = node.inventory.gpus[2].uuid, node.inventory.gpus[5].uuid
    replicas = await node.new_replicas()
    await replicas.apply([spec(devices=[two, five])])
    await until(replicas, ready())
    p = props(node)
    assert p["DevicePolicy"] == "closed"
    assert [tuple(d) for d in p["DeviceAllow"]] == [
        ("/dev/nvidia2", "rw"),
        ("/dev/nvidia5", "rw"),
        *SHARED,
    ]
    assert f"CUDA_VISIBLE_DEVICES={two},{five}" in p["Environment"]


async def test_a_cards_device_node_is_its_minor_number_not_its_index(node: Node) -> None:
    # The RTX 4090 machine's capture: NVML's cards 0..7 are /dev/nvidia3, 2, 1, 0, 7, 6, 5, 4.
    node.inventory = recorded(load("rtx4090-8x24gb"), toolkit="12.4")
    first, fifth = node.inventory.gpus[0].uuid, node.inventory.gpus[4].uuid
    replicas = await node.new_replicas()
    await replicas.apply([spec(devices=[first, fifth])])
    await until(replicas, ready())
    allowed = [tuple(d) for d in props(node)["DeviceAllow"]]
    assert allowed == [("/dev/nvidia3", "rw"), ("/dev/nvidia7", "rw"), *SHARED]


def test_an_older_agents_card_without_a_minor_number_keeps_its_index() -> None:
    inv = recorded(load("rtx4090-8x24gb"))
    old = msgspec.json.decode(
        msgspec.json.encode(inv).replace(b'"minor":', b'"unknown":'), type=type(inv)
    )
    assert old.gpus[0].minor == -1
    assert devices.nodes([old.gpus[0].uuid], old)[0] == "/dev/nvidia0"


async def test_an_engine_on_cpus_may_open_no_device(node: Node) -> None:
    replicas = await node.new_replicas()
    await replicas.apply([spec()])
    await until(replicas, ready())
    p = props(node)
    assert p["DevicePolicy"] == "closed" and "DeviceAllow" not in p
    assert not any(e.startswith("CUDA_") for e in p.get("Environment", []))


def test_a_mig_instance_opens_its_card_and_its_own_capabilities(tmp_path: Path) -> None:
    inv = recorded(load("a100-80gb-mig"))
    card = next(g for g in inv.gpus if g.instances)
    inst = card.instances[0]
    gi, ci = inst.gpu_instance_id, inst.compute_instance_id
    minors = tmp_path / "mig-minors"
    assert (card.index, card.minor) == (0, 1)  # the capture's: NVML's card 0 is /dev/nvidia1
    minors.write_text(
        f"config 1\nmonitor 2\ngpu0/gi{gi}/access 11\ngpu1/gi{gi}/access 21\n"
        f"gpu1/gi{gi}/ci{ci}/access 22\ngpu1/gi99/access 23\n"
    )
    got = devices.nodes([inst.uuid], inv, minors)
    assert got == [
        "/dev/nvidia1",
        *(d for d, _ in SHARED),
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    ]
    with pytest.raises(EngineError, match="MIG mode"):
        devices.nodes([card.uuid], inv, minors)


async def test_a_card_not_on_the_node_is_refused(node: Node) -> None:
    node.inventory = recorded(load("rtx4090-8x24gb"))
    replicas = await node.new_replicas()
    await replicas.apply([spec(devices=["GPU-not-here"])])
    (got,) = replicas.statuses()
    assert got.state == "failed" and "no card GPU-not-here on this node" in got.message
    assert node.fake.started == []


# Which cards an engine can use


async def test_llama_cpp_is_refused_where_the_driver_is_older_than_its_cuda(node: Node) -> None:
    node.inventory = recorded(load("rtx4090-8x24gb"), toolkit="12.8")  # driver: CUDA 12.4
    replicas = await node.new_replicas()
    await replicas.apply([spec(devices=[node.inventory.gpus[0].uuid])])
    (got,) = replicas.statuses()
    assert got.state == "failed" and node.fake.started == []
    assert got.message == (
        "driver 550.127.05 supports CUDA 12.4 < 12.8 that llama.cpp built with CUDA 12.8 needs"
    )


async def test_a_card_below_the_engines_compute_capability_is_refused(node: Node) -> None:
    node.inventory = recorded(pascal(), toolkit="13.0")  # CUDA 13 builds for 7.5 and up
    replicas = await node.new_replicas()
    await replicas.apply([spec(devices=[node.inventory.gpus[3].uuid])])
    (got,) = replicas.statuses()
    assert got.state == "failed" and node.fake.started == []
    assert got.message == (
        "card 3 (NVIDIA GeForce GTX 1080 Ti): compute capability 6.1 < 7.5 that llama.cpp"
        " built with CUDA 13.0 needs"
    )


def test_vllm_needs_compute_capability_7_5_and_a_driver_for_cuda_13() -> None:
    h100 = recorded(load("dgx-h100-8x80gb"))  # driver 565.57.01: CUDA 12.7
    vllm = spec(engine="vllm", devices=[h100.gpus[0].uuid])
    with pytest.raises(EngineError, match=r"driver 565.57.01 supports CUDA 12.7 < 13.0 that vLLM"):
        devices.check(vllm, h100)
    old = recorded(pascal())
    with pytest.raises(EngineError, match=r"compute capability 6.1 < 7.5 that vLLM"):
        devices.check(msgspec.structs.replace(vllm, devices=[old.gpus[0].uuid]), old)
    ok = msgspec.structs.replace(h100, cuda_version="13.0", gpu_driver_version="580.65.06")
    devices.check(vllm, ok)  # a Hopper card under a driver for CUDA 13.0


def test_llama_cpp_with_cuda_12_runs_on_pascal() -> None:
    old = recorded(pascal(), toolkit="12.4")
    devices.check(spec(devices=[old.gpus[0].uuid]), old)  # 6.1 >= 5.0, driver 13.0 >= 12.4


# Memory


async def test_the_unit_has_memory_high_at_nine_tenths_of_its_max(node: Node) -> None:
    replicas = await node.new_replicas()
    await replicas.apply([spec(memory_max_bytes=10 << 30)])
    await until(replicas, ready())
    p = props(node)
    assert p["MemoryMax"] == 10 << 30 and p["MemoryHigh"] == 9 << 30 == engine_memory.high(10 << 30)


# CPUs


async def test_engines_get_cpus_of_their_own_and_keep_them(node: Node) -> None:
    replicas = await node.new_replicas()
    await replicas.apply([spec("r1", cores=3), spec("r2", cores=3), spec("r3")])
    await until(replicas, lambda s: all(ready(r)(s) for r in ("r1", "r2", "r3")))
    r1, r2 = "llmgw-engine-r1.service", "llmgw-engine-r2.service"
    assert allowed(node, r1) == [0, 1, 2] and allowed(node, r2) == [3, 4, 5]
    assert "OMP_NUM_THREADS=3" in props(node, r1)["Environment"]
    assert props(node, r1)["CPUAffinity"] == props(node, r1)["AllowedCPUs"]  # v1 too
    assert "AllowedCPUs" not in props(node, "llmgw-engine-r3.service")  # cores 0: not pinned
    node.fake.kill(r1)  # restarted: the same CPUs
    await until(replicas, lambda s: ready()(s) and s["r1"].restarts >= 1)
    assert allowed(node, r1) == [0, 1, 2]
    await replicas.apply([spec("r1", cores=3), spec("r2", cores=3, context=2048), spec("r3")])
    await until(replicas, lambda s: ready("r2")(s) and node.fake.started.count(r2) == 2)
    assert allowed(node, r2) == [3, 4, 5]  # a changed spec: the same CPUs too
    await replicas.close()
    again = await node.new_replicas()  # an agent restarted: adopted engines keep theirs
    await again.apply(
        [spec("r1", cores=3), spec("r2", cores=3, context=2048), spec("r3"), spec("r4", cores=2)]
    )
    await until(again, ready("r4"))
    assert allowed(node, "llmgw-engine-r4.service") == [6, 7]


def test_cpus_are_picked_free_first_then_least_shared() -> None:
    assert cpus.pick(2, [[0, 1]], [0, 1, 2, 3]) == [2, 3]
    assert cpus.pick(2, [[0, 1], [2]], [0, 1, 2, 3], prefer=[0, 1]) == [0, 3]
    assert cpus.pick(2, [[0, 1]], [0, 1, 2, 3], prefer=[2, 3]) == [2, 3]
    assert cpus.pick(3, [[0, 1, 2, 3], [0]], [0, 1, 2, 3]) == [1, 2, 3]  # none free: shared
    assert cpus.pick(0, [], [0, 1]) == []
    assert cpus.cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert cpus.mask([0, 9]) == bytes([1, 2])


def test_llama_cpp_gets_a_thread_per_core_and_the_profiles_cache_type() -> None:
    s = spec(cores=3, cache_type="q8_0")
    argv = llamacpp.command(
        s, binary="/x/llama-server", host="127.0.0.1", port=1, key_file=None,
        threads=cpus.threads_for(s, 8),
    )  # fmt: skip
    assert argv[argv.index("--threads") + 1] == "3"
    assert argv[argv.index("--cache-type-k") + 1] == "q8_0"
    assert argv[argv.index("--cache-type-v") + 1] == "q8_0"
    assert cpus.threads_for(spec(), 8) == 8  # not pinned: agent.yaml's threads
    with pytest.raises(EngineError, match="fp8"):  # vLLM's, not llama.cpp's
        llamacpp.command(spec(cache_type="fp8"), binary="/x", host="h", port=1, key_file=None)


def test_vllm_threads_are_bound_to_its_cpus() -> None:
    assert cpus.thread_env("vllm", [4, 5, 6]) == [
        "OMP_NUM_THREADS=3",
        "VLLM_CPU_OMP_THREADS_BIND=4-6",
    ]
    assert cpus.thread_env("vllm", []) == []


# OOM


async def test_an_engine_killed_over_its_memory_is_reported_as_oom(node: Node) -> None:
    replicas = await node.new_replicas()
    await replicas.apply([spec()])
    await until(replicas, ready())
    node.fake.oom_kill(UNIT)
    got = (await until(replicas, lambda s: s["r1"].oom_kills == 1, within=5))["r1"]
    assert got.reason == "oom" and got.state == "failed"
    assert "over its memory limit" in got.message
    back = (await until(replicas, lambda s: ready()(s) and s["r1"].restarts >= 1))["r1"]
    assert back.oom_kills == 1 and back.reason == "oom"  # why it last stopped
    node.fake.kill(UNIT)  # a crash is no OOM kill
    crashed = (await until(replicas, lambda s: s["r1"].reason == "exit", within=5))["r1"]
    assert crashed.oom_kills == 1


async def test_on_cgroup_v1_a_sigkill_while_the_kernel_counted_an_oom_kill_is_oom(
    node: Node,
) -> None:
    # systemd cannot say oom-kill there: the engine just ends by SIGKILL.
    replicas = await node.new_replicas()
    await replicas.apply([spec()])
    await until(replicas, ready())
    node.kernel_ooms += 1
    node.fake.kill(UNIT)
    got = (await until(replicas, lambda s: s["r1"].oom_kills == 1, within=5))["r1"]
    assert got.reason == "oom" and "over its memory limit" in got.message
    await until(replicas, lambda s: ready()(s) and s["r1"].restarts >= 1)
    node.fake.kill(UNIT)  # no OOM kill counted meanwhile: a plain SIGKILL
    got = (await until(replicas, lambda s: s["r1"].reason == "exit", within=5))["r1"]
    assert got.oom_kills == 1 and "killed by signal SIGKILL" in got.message


def test_the_kernels_oom_count_is_read_from_vmstat(tmp_path: Path) -> None:
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 12\noom_kill 3\npgfault 9\n")
    assert oom.kernel_count(vmstat) == 3
    vmstat.write_text("nr_free_pages 12\n")  # a kernel before 4.13
    assert oom.kernel_count(vmstat) == -1
    assert oom.kernel_count(tmp_path / "none") == -1


# Readiness


def test_a_200_whose_body_says_loading_is_not_ready() -> None:
    assert health_code(200, b'{"status":"ok"}') == 200  # llama.cpp 11434.0.0, loaded
    assert health_code(200, b"") == 200  # vLLM
    assert health_code(200, b'{"status":"loading model"}') == 503
    assert health_code(200, b'{"status":"error"}') == 503
    assert health_code(503, b'{"error":{"code":503,"message":"Loading model"}}') == 503
    assert health_code(200, b"OK") == 200 and health_code(200, b"[]") == 200


async def test_an_engine_answering_200_while_loading_stays_starting(node: Node) -> None:
    def loading(spec: ReplicaSpec, host: str, port: int, key: str | None) -> list[str]:
        return [*engine_command(spec, host, port, key), "--load-s", "3600", "--loading-200"]

    replicas = await node.new_replicas(loading)
    await replicas.apply([spec()])
    got = await until(replicas, lambda s: "r1" in s and s["r1"].port > 0)
    port = got["r1"].port
    while True:  # until the engine answers /health (200, still loading)
        try:
            if await get(port, "/health", "") == 200:
                break
        except OSError:
            pass
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # several probes (every 0.05 s) have had that 200
    assert replicas.statuses()[0].state == "starting"
