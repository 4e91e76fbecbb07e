"""What this node has: cores, memory and disks (GPUs arrive with NVML in a later change)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from llmgw.wire import Disk, Inventory


def meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    """/proc/meminfo as bytes by field name."""
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
            out[name] = int(parts[0]) * scale
    return out


def cores() -> int:
    """The cores this process may run on (its affinity, as a cgroup or taskset limits it)."""
    return len(os.sched_getaffinity(0))


def disks(paths: list[str]) -> list[Disk]:
    """Size and free space of the filesystems holding paths (each filesystem once)."""
    seen: set[int] = set()
    out: list[Disk] = []
    for p in paths:
        try:
            dev = os.stat(p).st_dev
            usage = shutil.disk_usage(p)
        except OSError:
            continue
        if dev in seen:
            continue
        seen.add(dev)
        out.append(Disk(path=p, total_bytes=usage.total, free_bytes=usage.free))
    return out


def collect(state_dir: str) -> Inventory:
    """The node's inventory now."""
    mem = meminfo()
    return Inventory(
        cores=cores(),
        memory_bytes=mem.get("MemTotal", 0),
        memory_free_bytes=mem.get("MemAvailable", mem.get("MemFree", 0)),
        disks=disks([state_dir, "/"]),
    )
