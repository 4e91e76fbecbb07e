"""llama-server built with CUDA on the node, once per llama.cpp, toolkit and cards, when the first
replica on cards needs it (never in the agent's start-up), its progress told like a download."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from llmgw import proxy
from llmgw.config import LlamaCpp
from llmgw_agentd import once
from llmgw_agentd.engines import EngineError, llamacpp

log = logging.getLogger(__name__)

Progress = once.Progress  # the replica's "starting" message; "" clears it
TAIL = 20  # lines of the build's output kept for an error
# Where the script is: beside a package's files, else in this checkout.
SCRIPTS = (Path("/usr/share/llmgw/build-llama-server"),
           Path(__file__).resolve().parents[3] / "scripts" / "build-llama-server")  # fmt: skip


def find_script(env: dict[str, str] | None = None) -> Path:
    """scripts/build-llama-server: LLMGW_BUILD_LLAMA_SERVER, else where it is installed."""
    env = dict(os.environ) if env is None else env
    named = env.get("LLMGW_BUILD_LLAMA_SERVER")
    for path in [Path(named)] if named else SCRIPTS:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise EngineError("scripts/build-llama-server is not installed: llama.cpp cannot be built")


def architectures(capabilities: Iterable[str]) -> str:
    """The cards' compute capabilities as CUDA architectures: ["9.0", "8.6"] is "86;90"."""
    return ";".join(sorted({cc.replace(".", "") for cc in capabilities if cc}))


async def ensure_cuda_build(
    config: LlamaCpp,
    toolkit: str,
    capabilities: list[str],
    progress: Progress | None = None,
    *,
    cache: Path = llamacpp.SYSTEM_CACHE,
    script: Path | None = None,
    proxy_env: Mapping[str, str] | None = None,
) -> Path:
    """llama-server with CUDA for these cards: the site's binary, a build already made, or one
    made now by build-llama-server --cuda into cache (one build for every caller that waits
    for it, going on when they go; pip fetches the sdist through proxy_env's proxy, which
    replaces the agent's own proxy variables); raises EngineError saying why it cannot be had."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in proxy.ENV_NAMES}
    env |= {**(proxy_env or {}), "LLMGW_CACHE": str(cache)}
    cuda = (toolkit, capabilities)
    with contextlib.suppress(EngineError):
        return llamacpp.find_binary(config, env, cuda=cuda)
    if not toolkit:
        raise EngineError("no CUDA toolkit on this node: llama.cpp runs on CPUs only here")
    archs = architectures(capabilities)

    async def build(tell: Progress) -> Path:
        await _build(script or find_script(), env | {"LLAMA_CUDA_ARCHITECTURES": archs},
                     f"building llama.cpp with CUDA {toolkit}", tell)  # fmt: skip
        return llamacpp.find_binary(config, env, cuda=cuda)

    return await once.run(f"llama.cpp {cache} cuda{toolkit} {archs}", build, progress)


async def _build(script: Path, env: dict[str, str], what: str, progress: Progress) -> None:
    """Run the script; each of its steps ("fetching the sdist", "building, 45%") told."""
    progress(f"{what}: starting")
    log.info("%s (%s --cuda)", what, script)
    proc = await asyncio.create_subprocess_exec(
        str(script), "--cuda", stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stderr is not None
    tail: list[str] = []
    try:
        async for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            tail = [*tail[-(TAIL - 1) :], line]
            _, sep, step = line.partition("): ")
            if sep and line.startswith("llama-server "):
                progress(f"{what}: {step}")
        rc = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            with contextlib.suppress(ProcessLookupError):
                await proc.wait()
    if rc != 0:
        said = "; ".join(line for line in tail[-5:] if line.strip())
        raise EngineError(f"llama.cpp could not be built with CUDA (exit {rc}): {said}")
    log.info("%s: done", what)
