"""Which CPU ids each engine gets (its unit's AllowedCPUs) and how many threads it runs.

The scheduler reserves a number of cores for a replica (ReplicaSpec.cores); the agent picks
which: CPUs of its own affinity (what inventory.cores counted) that no other engine of the
node holds, lowest first. An engine started again (a restart, a changed spec) keeps the CPUs
it had. Where the node has fewer free CPUs than wanted (the agent's view and the scheduler's
differ for a moment, or a node shrank) the rest are shared with the engines holding fewest,
rather than the replica not running. spec.cores 0: no pinning, the engine's own threads.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence

from llmgw.wire import ReplicaSpec


def available() -> list[int]:
    """The CPU ids engines may be given: the agent's own affinity (a cgroup's or taskset's)."""
    return sorted(os.sched_getaffinity(0))


def pick(
    want: int, held: Iterable[Sequence[int]], cpus: Sequence[int], prefer: Sequence[int] = ()
) -> list[int]:
    """want CPU ids out of cpus: prefer's when it is as many and all still free (an engine
    started again keeps its CPUs), else the free ones lowest first, then those the fewest
    other engines hold. held: the CPUs of the node's other engines. [] when want is 0."""
    if want <= 0 or not cpus:
        return []
    use: Counter[int] = Counter()
    for h in held:
        use.update(h)
    usable = set(cpus)
    if len(prefer) == want and all(c in usable and not use[c] for c in prefer):
        return sorted(prefer)
    order = sorted(cpus, key=lambda c: (use[c], c))
    return sorted(order[: min(want, len(order))])


def threads_for(spec: ReplicaSpec, configured: int = 0) -> int:
    """An engine's thread count: one per core the scheduler reserved, else the configured
    (engines.llama.cpp.threads), else 0: the engine's own default."""
    return spec.cores if spec.cores > 0 else configured


def mask(cpus: Iterable[int]) -> bytes:
    """AllowedCPUs as systemd takes it over D-Bus ("ay"): CPU i is bit i % 8 of byte i // 8."""
    ids = list(cpus)
    if not ids:
        return b""
    out = bytearray(max(ids) // 8 + 1)
    for c in ids:
        out[c // 8] |= 1 << (c % 8)
    return bytes(out)


def cpu_list(cpus: Iterable[int]) -> str:
    """CPU ids as ranges, the form systemctl show prints and taskset -c takes: "0-3,6"."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def thread_env(engine: str, cpus: Sequence[int]) -> list[str]:
    """Environment lines that hold an engine's own threads to its CPUs: OpenMP's count (vLLM's
    CPU build, and any OpenMP runtime), and vLLM's binding of its threads to CPU ids (its
    "auto" would bind to CPUs of the whole NUMA node, outside AllowedCPUs). llama.cpp takes
    --threads instead (threads_for)."""
    if not cpus:
        return []
    env = [f"OMP_NUM_THREADS={len(cpus)}"]
    if engine == "vllm":
        env.append(f"VLLM_CPU_OMP_THREADS_BIND={cpu_list(cpus)}")
    return env
