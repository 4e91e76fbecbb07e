"""An engine's cards on this node: whether they suit its engine, and their device nodes.

A spec names its cards (or MIG instances) by UUID; the node's inventory (NVML) says which
card each is. The unit may open only those cards' /dev/nvidiaN (N: the card's minor number,
which is not always NVML's index: eight RTX 4090s recorded under tests/ have minors 3, 2, 1,
0, 7, 6, 5, 4), the driver's shared nodes (nvidiactl, nvidia-uvm, nvidia-uvm-tools), and,
for a MIG instance, its own capability files (/dev/nvidia-caps/nvidia-capM, M from the
driver's mig-minors list, which names the card by its minor number too). Everything else
is closed by DevicePolicy=closed, which still lets a CPU engine have /dev/null, /dev/zero,
/dev/full, /dev/random, /dev/urandom, /dev/tty and /dev/ptmx.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from llmgw import engine_cards
from llmgw.wire import Gpu, Inventory, ReplicaSpec
from llmgw_agentd.engines import EngineError

SHARED = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")


class Card(NamedTuple):
    """One UUID of a spec, found in the inventory: the card, and the MIG instance's ids."""

    gpu: Gpu
    mig: tuple[int, int] | None  # (GPU instance id, compute instance id) for a MIG UUID


def find(inventory: Inventory, uuid: str) -> Card:
    """The card (or MIG instance) with this UUID; EngineError when the node has none."""
    for g in inventory.gpus:
        if g.uuid == uuid and not g.mig:
            return Card(g, None)
        if g.uuid == uuid:
            raise EngineError(f"card {g.index} ({uuid}) is in MIG mode: name its instances")
        for i in g.instances:
            if i.uuid == uuid:
                return Card(g, (i.gpu_instance_id, i.compute_instance_id))
    raise EngineError(f"no card {uuid} on this node")


def check(spec: ReplicaSpec, inventory: Inventory) -> None:
    """Refuse a spec whose cards are not here, or are below what its engine needs (compute
    capability, driver); raises EngineError with the reason."""
    if not spec.devices:
        return
    needs = engine_cards.needs(spec.engine, cuda_toolkit=inventory.cuda_toolkit)
    why = engine_cards.driver_refusal(needs, inventory.cuda_version, inventory.gpu_driver_version)
    if why:
        raise EngineError(why)
    for uuid in spec.devices:
        card = find(inventory, uuid).gpu
        why = engine_cards.card_refusal(needs, card.compute_capability)
        if why:
            raise EngineError(f"card {card.index} ({card.name}): {why}")


def nodes(devices: list[str], inventory: Inventory, mig_minors: Path = MIG_MINORS) -> list[str]:
    """The device nodes an engine on these cards may open ([] for an engine on CPUs)."""
    if not devices:
        return []
    cards: list[str] = []
    caps: list[str] = []
    minors = _mig_minors(mig_minors) if any(d.startswith("MIG-") for d in devices) else {}
    for uuid in devices:
        card = find(inventory, uuid)
        number = minor(card.gpu)
        path = f"/dev/nvidia{number}"
        if path not in cards:
            cards.append(path)
        if card.mig is not None:
            gi, ci = card.mig
            base = f"gpu{number}/gi{gi}"
            for name in (f"{base}/access", f"{base}/ci{ci}/access"):
                if name in minors:
                    caps.append(f"/dev/nvidia-caps/nvidia-cap{minors[name]}")
    return cards + list(SHARED) + caps


def minor(gpu: Gpu) -> int:
    """The number of the card's device node: its minor number, else (an inventory older than
    it) NVML's index."""
    return gpu.minor if gpu.minor >= 0 else gpu.index


def _mig_minors(path: Path) -> dict[str, int]:
    """The driver's list of MIG capability files: "gpu0/gi1/access 12" as {name: minor}."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, minor = line.partition(" ")
        if minor.strip().isdigit():
            out[name] = int(minor)
    return out
