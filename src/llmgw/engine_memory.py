"""An engine's memory limit (its unit's MemoryMax), and the part llama.cpp's prompt cache may fill.

llmgwd gives each replica a limit from the scheduler's estimate of the RAM it takes (weights
+ KV cache for its context + margin, estimate.py): the estimate, a quarter more for what the
estimate misses, and 512 MiB for the process's own growth (libraries, HTTP buffers, one
request's answer). A replica placed by count (llmgwd could not read its file) gets the node's
default instead (agent.yaml engines.memory_max_bytes, else three quarters of the node's RAM).

llama-server keeps prompts it has processed in RAM (--cache-ram, 8 GiB by default) on top of
its KV cache: the agent sets it to half of the quarter, so that the cache never pushes the
engine over its limit.

Each unit also has MemoryHigh at nine tenths of its MemoryMax: above it the kernel reclaims
the engine's memory (page cache first: the weights' mapped pages are read again) and slows
it, so an engine nearing its limit shows as slow (memory.events' "high") before the kernel
kills it at MemoryMax (Result=oom-kill). An engine killed so is placed again with a larger
estimate (oom_factor): the estimate times 1.5 for each OOM kill seen, at most 4 times.
"""

from __future__ import annotations

MIB = 1 << 20
FIXED = 512 * MIB  # besides the estimate and its quarter
# An engine's own runtime in RAM, whatever model it serves, inside its estimate: vLLM is
# three Python processes with torch (API server, engine core, worker), measured here at
# 4.1-4.3 GB PSS serving SmolLM2-135M (260 MB of weights) with 1 GiB of KV cache on CPUs;
# llama-server's is inside the estimate's margin.
# FreeToken is torch too (its workers and tokenizer processes): taken as vLLM's, not measured.
RUNTIME_BYTES: dict[str, int] = {"llama.cpp": 0, "vllm": 3 << 30, "freetoken": 3 << 30}
LLAMA_CPP_CACHE_MAX_MIB = 8192  # llama-server's own default for --cache-ram


def limit(estimate: int) -> int:
    """The MemoryMax of a replica whose RAM the estimate gives (in whole MiB, as the kernel
    keeps it in pages)."""
    return -(-(estimate + estimate // 4) // MIB) * MIB + FIXED


def high(memory_max: int) -> int:
    """The MemoryHigh under a MemoryMax: nine tenths of it, in whole MiB."""
    return memory_max * 9 // 10 // MIB * MIB


OOM_GROWTH = 1.5  # the estimate's growth for each OOM kill seen
OOM_CAP = 4.0  # and its most


def oom_factor(oom_kills: int) -> float:
    """What an estimate is multiplied by after oom_kills OOM kills of the model's engines."""
    return min(OOM_GROWTH ** max(oom_kills, 0), OOM_CAP)


def default_limit(node_memory: int, configured: int = 0) -> int:
    """The MemoryMax of a replica without an estimate: configured, else 3/4 of the node's."""
    return configured or node_memory * 3 // 4


def prompt_cache_mib(memory_max: int) -> int:
    """llama-server's --cache-ram under a limit: an eighth of the estimate it came from."""
    estimate = max(0, memory_max - FIXED) * 4 // 5
    return min(estimate // 8 // MIB, LLAMA_CPP_CACHE_MAX_MIB)
