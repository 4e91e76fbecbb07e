"""Which cards an engine can use, and a larger estimate after OOM kills (recorded NVML answers)."""

from __future__ import annotations

import msgspec

from llmgw.wire import Inventory
from llmgwd.placement.estimate import memory_bytes
from llmgwd.placement.profiles import Profile
from llmgwd.placement.scheduler import Demand, Node, explain, schedule
from tests.llmgw_agentd.nvml_inventory import load, pascal, recorded
from tests.llmgwd.test_scheduler import CPU, LLAMA, SMOL, ids

GPU_VLLM = Profile(name="gpu", kind="gpu", engine="vllm", replicas=1)
GPU_LLAMA = Profile(name="gpu", kind="gpu", replicas=1)


def on(name: str, inv: Inventory) -> Node:
    return Node(name=name, inventory=inv)


def cuda13(inv: Inventory) -> Inventory:
    """The same machine with a driver for CUDA 13.0."""
    return msgspec.structs.replace(inv, cuda_version="13.0", gpu_driver_version="580.65.06")


def test_vllm_is_not_offered_a_driver_older_than_its_cuda() -> None:
    d = Demand("m", GPU_VLLM, LLAMA)
    dgx = on("dgx", recorded(load("dgx-h100-8x80gb")))
    plan = schedule([d], [dgx], [], new_id=ids)  # the H100s' driver 565.57.01: CUDA 12.7
    assert plan.add == []
    (why,) = plan.outcomes[0].refusals
    assert why.reason == "driver 565.57.01 supports CUDA 12.7 < 13.0 that vLLM (CUDA 13.0) needs"
    assert len(schedule([d], [on("dgx13", cuda13(dgx.inventory))], [], new_id=ids).add) == 1


def test_no_card_below_the_engines_compute_capability_is_offered() -> None:
    old = on("pascal", recorded(pascal(), toolkit="12.4"))  # GTX 1080 Ti: 6.1, CUDA 13.0
    plan = schedule([Demand("m", GPU_VLLM, LLAMA)], [old], [], new_id=ids)
    assert plan.add == []
    reasons = {v.reason for v in plan.outcomes[0].refusals}
    assert reasons == {"compute capability 6.1 < 7.5 that vLLM (CUDA 13.0) needs"}
    # llama.cpp built with CUDA 12.4 runs there (its floor 5.0); built with 13.0 it does not.
    assert len(schedule([Demand("m", GPU_LLAMA, LLAMA)], [old], [], new_id=ids).add) == 1
    cuda13_built = on("pascal", recorded(pascal(), toolkit="13.0"))
    verdicts = explain(Demand("m", GPU_LLAMA, LLAMA), [cuda13_built], [])
    assert verdicts[0].reason == (
        "compute capability 6.1 < 7.5 that llama.cpp built with CUDA 13.0 needs"
    )


def test_a_node_whose_agent_does_not_run_the_engine_there_is_not_offered() -> None:
    inv = msgspec.structs.replace(
        recorded(load("rtx4090-8x24gb")), engines=["llama.cpp:cpu", "vllm:cpu"]
    )
    (v,) = explain(Demand("m", GPU_LLAMA, LLAMA), [on("ws", inv)], [])
    assert not v.fits and v.reason == "its agent does not run llama.cpp on cards (no CUDA toolkit)"
    cpu_vllm = Profile(name="cpu", kind="cpu", engine="vllm", replicas=1, cores=2)
    assert schedule([Demand("m", cpu_vllm, SMOL)], [on("ws", inv)], [], new_id=ids).add
    only_llama = msgspec.structs.replace(inv, engines=["llama.cpp:cpu"])
    (v,) = explain(Demand("m", cpu_vllm, SMOL), [on("ws", only_llama)], [])
    assert v.reason == "its agent does not run vllm on CPUs"


def test_after_oom_kills_a_cpu_replica_is_placed_with_a_larger_estimate() -> None:
    cpu = Profile(name="cpu", kind="cpu", replicas=1, cores=2, context=4096)
    base = memory_bytes(SMOL, 4 * 4096, gpu=False)  # four slots of 4096 tokens
    (p,) = schedule([Demand("m", cpu, SMOL)], [CPU], [], new_id=ids).add
    assert p.slots == 4 and p.memory_bytes == base
    (p,) = schedule([Demand("m", cpu, SMOL, oom_kills=1)], [CPU], [], new_id=ids).add
    assert p.memory_bytes == int(base * 1.5)
    (p,) = schedule([Demand("m", cpu, SMOL, oom_kills=9)], [CPU], [], new_id=ids).add
    assert p.memory_bytes == int(base * 4)  # at most 4 times
    (v,) = explain(Demand("m", cpu, SMOL, oom_kills=2), [CPU], [])
    assert v.fits and "(the estimate x2.25 after 2 OOM kills of its engines)" in v.reason
