"""Whether a node runs an engine on its cards or its CPUs, as its agent reports (engines)."""

from __future__ import annotations

from llmgw.wire import Inventory

NO_TOOLKIT = "no CUDA toolkit: llama.cpp runs on CPUs only here"


def refusal(inventory: Inventory, engine: str, gpu: bool) -> str:
    """Why the node cannot run engine on its cards (gpu) or on its CPUs; "" where it can.

    An agent older than Inventory.engines (which lists none) runs llama.cpp on CPUs only:
    that was all it could run.
    """
    kind = "gpu" if gpu else "cpu"
    if f"{engine}:{kind}" in inventory.engines:
        return ""
    if engine == "llama.cpp" and not gpu:
        return ""  # every agent runs llama.cpp on CPUs
    if not inventory.engines:
        return f"its agent is older than {engine} on {'cards' if gpu else 'CPUs'}: upgrade it"
    if engine == "llama.cpp":
        if not inventory.cuda_toolkit:
            return NO_TOOLKIT
        return f"llama.cpp cannot be built with CUDA {inventory.cuda_toolkit} here (no cmake?)"
    if gpu and f"{engine}:cpu" in inventory.engines:
        return f"{engine} runs on CPUs only here (no card)"
    if not gpu and f"{engine}:gpu" in inventory.engines:
        return f"{engine} runs on cards only here"
    return f"{engine} is not enabled on this node"


def offers(inventory: Inventory, engine: str, gpu: bool) -> bool:
    """Whether the scheduler may place engine on the node's cards (gpu) or its CPUs."""
    return not refusal(inventory, engine, gpu)


def node_note(inventory: Inventory) -> str:
    """What people should know of a node's engines ("" for nothing): a node with cards and no
    CUDA toolkit runs llama.cpp on CPUs only."""
    if inventory.gpus and not inventory.cuda_toolkit:
        return NO_TOOLKIT
    return ""
