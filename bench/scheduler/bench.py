"""The scheduler on a simulated cluster: 1,000 nodes, 5,000 replicas, no processes.

Prints the time of one full placement pass (nothing placed yet), of one change (one
model's count +1, everything else already placed), of a pass where one profile fits
nowhere (so every node and card is explained), and tracemalloc's peak for a full pass.
Figures only; read them against the goal of a full pass under one second.

    bench/scheduler/run [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmgw.wire import Gpu, Inventory  # noqa: E402
from llmgw_agentd.gpus import GpuReader  # noqa: E402
from llmgwd.placement.estimate import GIB  # noqa: E402
from llmgwd.placement.gguf_meta import shape_of  # noqa: E402
from llmgwd.placement.profiles import Profile  # noqa: E402
from llmgwd.placement.scheduler import Demand, Node, Placement, schedule  # noqa: E402
from tests.llmgw_agentd.fake_nvml import FakeNvml  # noqa: E402

GGUF = ROOT / "tests/llmgwd/gguf"
# (recording, count, cores, RAM): 250 DGX H100 nodes, 150 A100 nodes with one card in
# MIG mode, 200 GeForce nodes (8x RTX 4090), 400 CPU-only nodes.
FLEET = [
    ("dgx-h100-8x80gb", 250, 112, 2048 * GIB),
    ("a100-80gb-mig", 150, 64, 1024 * GIB),
    ("rtx4090-8x24gb", 200, 16, 128 * GIB),
    (None, 400, 64, 512 * GIB),
]


def _idle(g: Gpu, suffix: str) -> Gpu:
    instances = [
        msgspec.structs.replace(
            i, uuid=f"{i.uuid}-{suffix}", memory_free_bytes=i.memory_total_bytes - (64 << 20)
        )
        for i in g.instances
    ]
    return msgspec.structs.replace(
        g,
        uuid=f"{g.uuid}-{suffix}",
        memory_free_bytes=g.memory_total_bytes - (64 << 20),
        instances=instances,
    )


def cluster() -> list[Node]:
    """1,000 nodes, GPUs as NVML reported them on the recorded machines (made idle and
    given their own UUIDs)."""
    nodes: list[Node] = []
    for recording, count, cores, ram in FLEET:
        gpus = GpuReader(FakeNvml.load(recording)).read().gpus if recording else []
        kind = recording or "cpu"
        for i in range(count):
            name = f"{kind}-{i:03d}"
            inv = Inventory(
                cores=cores,
                memory_bytes=ram,
                memory_free_bytes=ram - 16 * GIB,
                gpus=[_idle(g, name) for g in gpus],
                memory_bandwidth_bytes_s=300_000_000_000,
                memory_bandwidth_one_core_bytes_s=25_000_000_000,
            )
            nodes.append(Node(name=name, inventory=inv))
    return nodes


def demands() -> list[Demand]:
    """1,200 models, 5,000 replicas in all: small models on CPUs, 8B and 9B models on any
    card, 72B models on the large cards with their whole context."""
    smol = shape_of(GGUF / "smollm2-135m-instruct-q4_1.copied.gguf")
    llama = shape_of(GGUF / "llama-3.1-8b-instruct-q4_k_m.synth.gguf")
    gemma = shape_of(GGUF / "gemma-2-9b-it-q4_k_m.synth.gguf")
    qwen = shape_of(GGUF / "qwen2.5-72b-instruct-q4_k_m.synth.gguf")
    kinds = [
        # (models, shape, profile)
        (600, smol, Profile(name="cpu", kind="cpu", replicas=3, cores=8)),
        (200, llama, Profile(name="gpu", kind="gpu", replicas=8, context=8192)),
        (300, gemma, Profile(name="gpu", kind="gpu", replicas=4)),
        (100, qwen, Profile(name="gpu", kind="gpu", replicas=4, min_context=32768)),
    ]
    out: list[Demand] = []
    n = itertools.count()
    for count, shape, profile in kinds:
        for _ in range(count):
            out.append(Demand(model=f"m{next(n):04d}", profile=profile, shape=shape))
    return out


_ids = itertools.count()


def ids(model: str) -> str:
    return f"{model}-{next(_ids):05x}"


def best(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    """Run the passes and print their figures."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each pass (the best is shown)")
    args = ap.parse_args()
    nodes, wanted = cluster(), demands()
    places = sum(len(g.instances) if g.mig else 1 for n in nodes for g in n.inventory.gpus)
    replicas = sum(d.profile.replicas for d in wanted)
    print(
        f"cluster: {len(nodes)} nodes, {places} GPU places, {replicas} replicas wanted "
        f"of {len(wanted)} models"
    )

    plan = schedule(wanted, nodes, [], new_id=ids)
    placed: list[Placement] = plan.add
    unplaced = sum(o.unplaced for o in plan.outcomes)
    print(
        f"placed: {len(placed)} replicas, {unplaced} unplaced, on "
        f"{len({p.node for p in placed})} nodes"
    )

    full = best(args.repeat, lambda: schedule(wanted, nodes, [], new_id=ids))
    print(f"full pass (nothing placed before):     {full * 1000:8.1f} ms")

    one = msgspec.structs.replace(
        wanted[700], profile=msgspec.structs.replace(wanted[700].profile, replicas=9)
    )
    changed = [one if d is wanted[700] else d for d in wanted]
    change_plan = schedule(changed, nodes, placed, new_id=ids)
    assert len(change_plan.add) == 1 and not change_plan.remove
    change = best(args.repeat, lambda: schedule(changed, nodes, placed, new_id=ids))
    print(f"one change (a model's count +1):       {change * 1000:8.1f} ms")

    huge = Demand(
        model="too-big",
        profile=Profile(name="gpu", kind="gpu", replicas=1, gpus=9),
        shape=wanted[-1].shape,
    )
    explained = schedule([*wanted, huge], nodes, placed, new_id=ids)
    refusals = next(o for o in explained.outcomes if o.model == "too-big").refusals
    t = best(args.repeat, lambda: schedule([*wanted, huge], nodes, placed, new_id=ids))
    print(
        f"pass with one unplaceable profile:     {t * 1000:8.1f} ms "
        f"({len(refusals)} verdicts explained)"
    )

    gc.collect()
    tracemalloc.start()
    schedule(wanted, nodes, [], new_id=ids)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"memory, full pass (tracemalloc peak):  {peak / 2**20:8.1f} MiB")
    print(f"goal: a full pass under 1 s -> {'met' if full < 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
