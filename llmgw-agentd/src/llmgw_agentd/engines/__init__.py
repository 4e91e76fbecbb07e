"""Engines a node runs: the command line of a replica, checked before it reaches systemd."""

from __future__ import annotations

import contextlib
import re
import stat
from pathlib import Path

from llmgw import engine_args
from llmgw.config import AgentConfig
from llmgw.wire import ReplicaSpec

# Every engine answers 200 here when ready, 503 while loading; FreeToken 200 from the start,
# its body's status "loading" until it serves (replicas/health.py: health_code).
HEALTH_PATH = "/health"
PROPS_PATH = "/props"  # llama.cpp: its total_slots and a slot's n_ctx (key needed)
MODELS_PATH = "/v1/models"  # vLLM: ready once it lists the model (key needed)
METRICS_PATH = "/metrics"  # Prometheus' text: the requests an engine holds (key needed)
# The gauges whose sum is the requests an engine holds (running and waiting), by engine.
BUSY_GAUGES = {
    "llama.cpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
}


class EngineError(ValueError):
    """A replica that cannot be started as specified; the message says why."""


def check(spec: ReplicaSpec) -> None:
    """Refuse a spec that can never run (unknown engine, refused args); raises EngineError."""
    if spec.engine == "llama.cpp":
        from llmgw_agentd.engines import llamacpp

        llamacpp.check_source(spec)
        llamacpp.validate_args(spec.args)
        return
    if spec.engine == "vllm":
        from llmgw_agentd.engines import vllm

        vllm.check_source(spec)
        vllm.validate_args(spec.args)
        return
    if spec.engine == "freetoken":
        from llmgw_agentd.engines import freetoken

        freetoken.check_source(spec)
        freetoken.validate_args(spec.args)
        return
    raise EngineError(f"engine {spec.engine!r} is not supported on this node")


def slots(spec: ReplicaSpec, said: int) -> int:
    """The requests a ready engine serves at once, the router's cap for it: what it said
    (llama.cpp's /props), else the placement's, else its own (vLLM's --max-num-seqs: the
    args', else its default; its requests share a paged KV cache); 0: not known."""
    return said or spec.slots or engine_args.own_slots(spec.engine, spec.args)


def local_source(spec: ReplicaSpec, set_dir: Path) -> str:
    """The file: source an engine loads an hf: set from, once the cache holds it in set_dir:
    llama.cpp's GGUF file, vLLM's and FreeToken's directory."""
    if spec.engine == "llama.cpp":
        from llmgw_agentd.engines import llamacpp

        return f"file:{set_dir / llamacpp.gguf_in(spec.files)}"
    if spec.engine in ("vllm", "freetoken"):
        return f"file:{set_dir}"
    raise EngineError(f"engine {spec.engine!r} is not supported on this node")


def command(
    spec: ReplicaSpec,
    config: AgentConfig,
    *,
    host: str,
    port: int,
    key_file: str | None,
    cuda: tuple[str, list[str]] | None = None,
) -> list[str]:
    """The argv that runs spec's engine as the unit's dynamic user (llama.cpp on cards: its
    CUDA build for cuda, the toolkit and the cards' compute capabilities); raises EngineError."""
    if spec.engine == "llama.cpp":
        from llmgw_agentd import cpus
        from llmgw_agentd.engines import llamacpp

        binary = llamacpp.find_binary(config.engines.llama_cpp, cuda=cuda)
        check_reachable(binary, "llama-server", execute=True)
        check_reachable(Path(llamacpp.model_path(spec)), "model", execute=False)
        return llamacpp.command(
            spec,
            binary=str(binary),
            host=host,
            port=port,
            key_file=key_file,
            threads=cpus.threads_for(spec, config.engines.llama_cpp.threads),
        )
    if spec.engine == "vllm":
        from llmgw_agentd.engines import vllm

        python = vllm.env_dir(config, spec) / "bin" / "python"
        check_reachable(python, "vLLM's python", execute=True)
        return vllm.command(spec, python=str(python), host=host, port=port, key_file=key_file)
    if spec.engine == "freetoken":
        from llmgw_agentd.engines import freetoken

        python = freetoken.env_dir(config) / "bin" / "python"
        check_reachable(python, "FreeToken's python", execute=True)
        return freetoken.command(spec, python=str(python), host=host, port=port, key_file=key_file)
    raise EngineError(f"engine {spec.engine!r} is not supported on this node")


def check_reachable(path: Path, what: str, *, execute: bool) -> None:
    """Refuse a file the engine's unprivileged dynamic user could not read (or execute)."""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise EngineError(f"{what} {path}: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise EngineError(f"{what} {path}: not a regular file")
    need = stat.S_IXOTH if execute else stat.S_IROTH
    if not mode & need:
        verb = "execute" if execute else "read"
        raise EngineError(f"{what} {path}: others may not {verb} it (engines run as dynamic users)")
    for parent in path.absolute().parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            raise EngineError(
                f"{what} {path}: directory {parent} is not searchable by others (engines run"
                " as dynamic users: use a world-readable place such as /var/cache/llmgw-agent)"
            )


def models_path(spec: ReplicaSpec) -> str | None:
    """Where an engine whose /health answered 200 says whether it serves its model yet
    (vLLM lists it in /v1/models once loaded); None: /health is enough."""
    return MODELS_PATH if spec.engine == "vllm" else None


def lists_model(spec: ReplicaSpec, body: bytes) -> bool:
    """Whether models_path's answer lists spec's model."""
    from llmgw_agentd.engines import vllm

    return vllm.lists_model(body, spec.model)


def requests_held(spec: ReplicaSpec, metrics: str) -> int:
    """The requests spec's engine holds, running or waiting, from its /metrics text."""
    names = BUSY_GAUGES.get(spec.engine, ())
    total = 0.0
    for line in metrics.splitlines():
        if re.split(r"[{\s]", line, maxsplit=1)[0] not in names:
            continue
        labelled = "{" in line
        fields = line.rsplit("}", 1)[-1].split()[0 if labelled else 1 :]
        with contextlib.suppress(IndexError, ValueError):
            total += float(fields[0])
    return int(total)
