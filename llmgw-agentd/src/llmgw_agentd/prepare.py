"""An engine's software made ready before a replica starts on it: vLLM's environment
installed, llama-server built with CUDA for the replica's cards (each once for every replica
that waits for it, in the background, its progress the replicas' "starting" message)."""

from __future__ import annotations

import os
from pathlib import Path

from llmgw.config import AgentConfig
from llmgw.wire import Inventory, ReplicaSpec
from llmgw_agentd import devices, llama_build, once
from llmgw_agentd.engines import EngineError, install, llamacpp


def cuda(spec: ReplicaSpec, inventory: Inventory) -> tuple[str, list[str]] | None:
    """For llama.cpp on cards, the CUDA build it needs: the node's toolkit and its cards'
    compute capabilities; None for an engine on CPUs or another engine."""
    if spec.engine != "llama.cpp" or not spec.devices:
        return None
    caps = [devices.find(inventory, uuid).gpu.compute_capability for uuid in spec.devices]
    return inventory.cuda_toolkit, caps


def build_cache() -> Path:
    """Where the agent builds llama-server: LLMGW_CACHE, else /var/cache/llmgw-agent (both among
    the caches llamacpp.find_binary looks in)."""
    return Path(os.environ.get("LLMGW_CACHE") or llamacpp.SYSTEM_CACHE)


async def ensure(
    spec: ReplicaSpec, config: AgentConfig, inventory: Inventory, progress: once.Progress
) -> None:
    """Make spec's engine software ready on this node; raises EngineError saying why not."""
    if spec.engine in ("vllm", "freetoken"):
        engine = f"{spec.engine}:{'gpu' if spec.devices else 'cpu'}"
        site = install.site_of(config, engine)
        if site.env:
            return
        try:
            await install.ensure_env(engine, site.version, config, progress)
        except install.InstallError as e:
            raise EngineError(str(e)) from None
        return
    wants = cuda(spec, inventory)
    if wants is not None:
        await llama_build.ensure_cuda_build(
            config.engines.llama_cpp,
            *wants,
            progress,
            cache=build_cache(),
            proxy_env=config.network.route(os.environ).env(),  # pip fetches the sdist
        )
