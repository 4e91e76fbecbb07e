"""gres.conf from the nodes' NVML inventories: one gpu line per card, by its device file."""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.wire import Gpu, Inventory


def device_file(gpu: Gpu) -> str:
    """The card's device node (/dev/nvidiaN, N its minor number; its index from an agent that
    does not tell the minor)."""
    return f"/dev/nvidia{gpu.minor if gpu.minor >= 0 else gpu.index}"


def gpu_count(inventory: Inventory) -> int:
    """The cards Slurm is given on a node (a card in MIG mode is not: its instances are
    llmgw's places, and Slurm would need them configured one by one)."""
    return sum(1 for g in inventory.gpus if not g.mig)


def gres_conf(inventories: Mapping[str, Inventory]) -> str:
    """The gres.conf text for these nodes (name -> inventory), in name order."""
    lines = ["# Made by llmgw: do not edit (the leader writes it again)."]
    for name in sorted(inventories):
        for gpu in sorted(inventories[name].gpus, key=lambda g: g.index):
            if not gpu.mig:
                lines.append(f"NodeName={name} Name=gpu File={device_file(gpu)}")
    return "\n".join(lines) + "\n"
