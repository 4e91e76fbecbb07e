"""What this node has: cores, memory, disks, and (given their readers) GPUs and memory bandwidth."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from llmgw.wire import Disk, Inventory
from llmgw_agentd.gpus import GpuReader
from llmgw_agentd.membw import Bandwidth


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


def collect(
    state_dir: str, gpus: GpuReader | None = None, bandwidth: Bandwidth | None = None
) -> Inventory:
    """The node's inventory now: its cards read through gpus (none without a reader), and
    the bandwidth measured at the agent's start (membw.measure) where it was."""
    mem = meminfo()
    report = gpus.read() if gpus is not None else None
    return Inventory(
        cores=cores(),
        memory_bytes=mem.get("MemTotal", 0),
        memory_free_bytes=mem.get("MemAvailable", mem.get("MemFree", 0)),
        disks=disks([state_dir, "/"]),
        gpus=report.gpus if report else [],
        gpu_driver_version=report.driver_version if report else "",
        cuda_version=report.cuda_version if report else "",
        memory_bandwidth_bytes_s=bandwidth.all_cores if bandwidth else 0,
        memory_bandwidth_one_core_bytes_s=bandwidth.one_core if bandwidth else 0,
    )
