"""Memory and speed estimates of a model before it starts: weights, KV cache, context, tokens/s.

The figures come from a ModelShape, read from a GGUF's header (gguf_meta) or a safetensors
model's config.json and file sizes (safetensors_meta). Each constant below says where it
comes from, or that it is an assumption to calibrate.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Literal

import msgspec

from llmgw.api_types import CacheType as CacheType  # a model's KV cache type (Profile.cache_type)

MIB = 1 << 20
GIB = 1 << 30


# Bytes per cached value: ggml's block sizes (q8_0 keeps 32 values in 34 bytes: 32 int8 and
# an f16 scale; q4_0 32 in 18) for llama.cpp's --cache-type-k/-v, and vLLM's fp8.
CACHE_BYTES: dict[str, Fraction] = {
    "f32": Fraction(4),
    "f16": Fraction(2),
    "bf16": Fraction(2),
    "q8_0": Fraction(34, 32),
    "q5_1": Fraction(24, 32),
    "q5_0": Fraction(22, 32),
    "q4_1": Fraction(20, 32),
    "q4_0": Fraction(18, 32),
    "iq4_nl": Fraction(18, 32),
    "fp8": Fraction(1),
}

# llama.cpp sizes its context in steps of 256 tokens; a context is offered in such steps.
CONTEXT_STEP = 256

# Requests a replica serves at once (its slots: llama.cpp's --parallel; not vLLM's, whose
# requests share a paged KV cache), each with the whole context: as many as the KV cache of
# that many contexts fits in the room beside the weights, at least one, at most MAX_SLOTS
# (llama-server's own default; more rarely helps a replica of a CPU's or one card's speed).
MAX_SLOTS = 4

# The margin beside weights and KV cache, for what an engine allocates besides them:
# - a CUDA context and cuBLAS's workspace on a card: 512 MiB (300-500 MiB is what a CUDA
#   context takes on current drivers; nothing of it shows in NVML's free memory beforehand);
#   128 MiB for the process itself on CPUs;
# - the compute buffer, whose largest part is one micro-batch's logits: 512 tokens (llama.cpp's
#   default -ub) x the vocabulary x 4 bytes (f32): 262 MB for Llama 3's 128256 tokens;
# - 2 % of the weights for the layers' activations and scratch (with flash attention, which
#   llama.cpp turns on where it can, these do not grow with the context).
GPU_FIXED = 512 * MIB
CPU_FIXED = 128 * MIB
UBATCH = 512
SCRATCH = Fraction(2, 100)

# CPU decode is memory-bound: each new token reads every weight it uses once (all of them for
# a dense model, the experts in use for a mixture of experts), plus the KV cache so far:
#   tokens/s = DECODE_EFFICIENCY x bandwidth / bytes read per token.
# DECODE_EFFICIENCY 0.5: the agent's figure is a STREAM-like copy (bytes read + written) by
# plain memcpy, and llama.cpp's decode, with its dequantization and thread syncs between
# layers, streams weights at a fraction of that; a half is an assumption to calibrate
# against real replicas' tokens/s (the router's usage has them), not a measured factor.
# FLOPS_PER_CORE: a small model is compute-bound instead: SmolLM2-135M Q4_1 answers at about
# 80 tokens/s on this project's 2-core test machine (DESIGN.md), 2 FLOP per parameter and
# token: 80 x 2 x 135M / 2 cores = 11 GFLOP/s per core; 12 is used.
DECODE_EFFICIENCY = 0.5
FLOPS_PER_CORE = 12e9


class ModelShape(msgspec.Struct, frozen=True, kw_only=True):
    """What the estimates need to know of a model, read from its files' metadata (by
    placement.model_shape, from a file: source or the mirror's copy of a set)."""

    format: Literal["gguf", "safetensors"]
    architecture: str  # "llama", "qwen2", ... (GGUF general.architecture, or config model_type)
    weights_bytes: int  # all tensors' bytes: what must be in memory
    context_length: int  # the context the model was trained for
    layers: int
    head_count: int
    kv_heads: int  # KV heads of one layer (the largest where layers differ)
    key_length: int  # one head's key size (the head size)
    value_length: int
    embedding_length: int = 0
    vocab_size: int = 0
    parameters: int = 0  # all weights' values
    # Weights read to make one token: all of them for a dense model, less the embedding
    # table where the output has its own, the experts in use only for a mixture of experts.
    bytes_per_token: int = 0
    parameters_per_token: int = 0
    kv_heads_per_layer: list[int] = []  # where layers differ (GGUF arrays); [] when uniform
    cache_type: CacheType = "f16"  # the engine's default cache type for this model

    def kv_values_per_token(self) -> int:
        """Values one token keeps in the KV cache: keys and values of every layer's heads."""
        heads = (
            sum(self.kv_heads_per_layer)
            if self.kv_heads_per_layer
            else (self.kv_heads * self.layers)
        )
        return heads * (self.key_length + self.value_length)


def kv_bytes_per_token(shape: ModelShape, cache: CacheType | None = None) -> int:
    """Bytes of KV cache one token takes, for a cache type (the model's default if None)."""
    return kv_bytes(shape, 1, cache)


def kv_bytes(shape: ModelShape, context: int, cache: CacheType | None = None) -> int:
    """Bytes of KV cache for context tokens (rounded up)."""
    exact = shape.kv_values_per_token() * CACHE_BYTES[cache or shape.cache_type] * context
    return -(-exact.numerator // exact.denominator)


def margin_bytes(shape: ModelShape, gpu: bool, shards: int = 1) -> int:
    """The margin beside weights and cache (see GPU_FIXED above), on each of shards cards."""
    fixed = GPU_FIXED if gpu else CPU_FIXED
    logits = UBATCH * shape.vocab_size * 4
    return fixed + logits + int(shape.weights_bytes * SCRATCH) // shards


def memory_bytes(
    shape: ModelShape, context: int, cache: CacheType | None = None, gpu: bool = True
) -> int:
    """Memory one replica takes at a context: weights + KV cache + margin."""
    return shape.weights_bytes + kv_bytes(shape, context, cache) + margin_bytes(shape, gpu)


def on_card(shape: ModelShape, engine: str) -> ModelShape:
    """The shape a card holds of a model: all of it, but for FreeToken, which keeps a mixture
    of experts' experts in RAM and streams them in (the card holds what one token reads: the
    dense part and the experts in use, plus the KV cache); its RAM limit (ram_bytes) keeps
    every weight."""
    if engine != "freetoken" or not 0 < shape.bytes_per_token < shape.weights_bytes:
        return shape
    return msgspec.structs.replace(shape, weights_bytes=shape.bytes_per_token)


def runtime_bytes(engine: str) -> int:
    """RAM an engine takes whatever model it serves (engine_memory.RUNTIME_BYTES; 0 for one
    not listed)."""
    from llmgw.engine_memory import RUNTIME_BYTES

    return RUNTIME_BYTES.get(engine, 0)


def ram_bytes(
    shape: ModelShape,
    context: int,
    cache: CacheType | None = None,
    gpu: bool = False,
    engine: str = "llama.cpp",
) -> int:
    """RAM one replica may take (what its memory limit is made from): as on CPUs, on cards
    too, where layers or the KV cache can stay in RAM (-ngl, --no-kv-offload), plus the
    CUDA runtime's host side (GPU_FIXED again) and the engine's own runtime."""
    base = memory_bytes(shape, context, cache, gpu=False) + (GPU_FIXED if gpu else 0)
    return base + runtime_bytes(engine)


def kv_room(shape: ModelShape, budget: int, gpu: bool = True, shards: int = 1) -> int:
    """Bytes left for the KV cache in budget on each of shards cards (or in RAM), beside
    the weights (split evenly over the cards) and each card's margin."""
    return shards * (budget - margin_bytes(shape, gpu, shards)) - shape.weights_bytes


def context_that_fits(
    shape: ModelShape,
    budget: int,
    cache: CacheType | None = None,
    gpu: bool = True,
    limit: int = 0,
    shards: int = 1,
    slots: int = 1,
) -> int:
    """The longest context (in steps of 256, at most the trained one or limit) whose replica
    with slots such contexts fits in budget bytes, split evenly over shards cards each with
    budget; 0 if none does."""
    room = kv_room(shape, budget, gpu, shards)
    top = min(limit, shape.context_length) if limit else shape.context_length
    per = Fraction(shape.kv_values_per_token()) * CACHE_BYTES[cache or shape.cache_type] * slots
    if room <= 0:
        return 0
    if per == 0:
        return top
    fits = int(room / per) // CONTEXT_STEP * CONTEXT_STEP
    return min(fits, top) if fits >= min(CONTEXT_STEP, top) else 0


def slots_that_fit(
    shape: ModelShape,
    budget: int,
    context: int,
    cache: CacheType | None = None,
    gpu: bool = True,
    shards: int = 1,
) -> int:
    """How many requests of context tokens each one replica serves at once in budget bytes
    (on each of shards cards): the KV cache of that many contexts beside the weights and
    the margin, at least 1 (the context itself is what context_that_fits found), at most
    MAX_SLOTS."""
    per = kv_bytes(shape, context, cache)
    if per <= 0:
        return MAX_SLOTS
    return max(1, min(MAX_SLOTS, kv_room(shape, budget, gpu, shards) // per))


def shard_bytes(
    shape: ModelShape, context: int, cache: CacheType | None = None, shards: int = 1
) -> int:
    """Memory each of shards cards takes for one replica split across them (weights and cache
    split evenly, each card with its own margin)."""
    share = -(-(shape.weights_bytes + kv_bytes(shape, context, cache)) // shards)
    return share + margin_bytes(shape, True, shards)


def cpu_bandwidth(one_core: int, all_cores: int, cores: int, node_cores: int) -> int:
    """The bandwidth cores of a node's node_cores get: one core's figure times cores, up to
    the all-core figure (memory is shared; a few cores already take most of it)."""
    if cores >= node_cores or not one_core:
        return all_cores
    return min(all_cores or one_core * cores, one_core * cores)


def cpu_tokens_per_s(
    shape: ModelShape, bandwidth: int, cores: int, context: int = 0, cache: CacheType | None = None
) -> float:
    """Decode tokens/s on cores with bandwidth bytes/s (a STREAM-copy figure), at a context
    already filled: the lower of the memory bound and the compute bound (see the constants)."""
    read = (shape.bytes_per_token or shape.weights_bytes) + kv_bytes(shape, context, cache)
    memory_bound = DECODE_EFFICIENCY * bandwidth / read if read else 0.0
    params = shape.parameters_per_token or shape.parameters
    compute_bound = cores * FLOPS_PER_CORE / (2 * params) if params else memory_bound
    return min(memory_bound, compute_bound)


def gib(n: int) -> str:
    """Bytes as people read them in a plan: "4.6 GiB", "512 MiB"."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"
