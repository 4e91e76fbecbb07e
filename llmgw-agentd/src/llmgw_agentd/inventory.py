"""What this node has: cores, memory, disks, GPUs and memory bandwidth (given their readers),
the CUDA toolkit, and the engines it can run."""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from llmgw import engine_cards
from llmgw.wire import Disk, Gpu, Inventory
from llmgw_agentd.engines import llamacpp
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


_RELEASE = re.compile(r"release (\d+\.\d+)")
CUDA_HOME = Path("/usr/local/cuda")


def cuda_toolkit(nvcc: str | None, version_json: Path = CUDA_HOME / "version.json") -> str:
    """The CUDA toolkit's version ("12.4"): what `nvcc --version` says, else the toolkit's
    version.json; "" where neither is here."""
    if nvcc:
        try:
            out = subprocess.run(
                [nvcc, "--version"], capture_output=True, text=True, timeout=30, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        if m := _RELEASE.search(out):
            return m.group(1)
    try:
        version = str(json.loads(version_json.read_text())["cuda"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return ".".join(version.split(".")[:2])


def find_nvcc() -> str | None:
    """nvcc on PATH, else the toolkit's in /usr/local/cuda (as build-llama-server finds it)."""
    path = shutil.which("nvcc") or CUDA_HOME / "bin" / "nvcc"
    return str(path) if os.access(path, os.X_OK) else None


def has_cublas(home: Path = CUDA_HOME) -> bool:
    """Whether cuBLAS's headers are here (llama.cpp's CUDA build links it): an nvcc alone,
    as pip's nvidia-cuda-nvcc installs it, builds nothing (seen on the test machine)."""
    found = [home / "include", *home.glob("targets/*/include"), Path("/usr/include")]
    return any((d / "cublas_v2.h").is_file() for d in found)


@functools.cache
def installed_toolkit() -> str:
    """This node's CUDA toolkit, asked once (a toolkit installed later is seen after a
    restart of the agent)."""
    return cuda_toolkit(find_nvcc())


FREETOKEN_DRIVER = 580  # the driver series CUDA 13.0 asks for (engine_cards.py)


def freetoken_runs(gpus: list[Gpu], toolkit: str, driver: str, machine: str) -> bool:
    """Whether FreeToken can run here: PyPI has it for x86-64 only, it compiles its kernels
    with a CUDA 13 toolkit, and asks a driver of the 580 series or later and a card of
    compute capability 8.0 or more (the scheduler passes over the others: engine_cards)."""
    floor = engine_cards.FREETOKEN_FLOOR
    return (
        machine == "x86_64"
        and engine_cards.version(toolkit)[0] >= 13
        and engine_cards.version(driver)[0] >= FREETOKEN_DRIVER
        and any(engine_cards.version(g.compute_capability) >= floor for g in gpus)
    )


def engines(
    gpus: list[Gpu],
    toolkit: str,
    vllm: bool,
    *,
    can_build: bool | None = None,
    driver: str = "",
    machine: str | None = None,
) -> list[str]:
    """The engines this node runs, "ENGINE:cpu" or "ENGINE:gpu": llama.cpp on CPUs always; on
    its cards where a CUDA build is here or can be made (the toolkit and cmake); vLLM on its
    cards (or CPUs, without cards) where the agent's configuration allows it; FreeToken on
    its cards where freetoken_runs (the driver's version given, "": not known, none)."""
    out = ["llama.cpp:cpu"]
    if gpus and toolkit:  # a CUDA build runs on the toolkit's own libraries
        capabilities = [g.compute_capability for g in gpus]
        built = any(p.is_file() for p in llamacpp.cuda_binary_candidates(toolkit, capabilities))
        if can_build is None:
            can_build = shutil.which("cmake") is not None and has_cublas()
        if built or can_build:
            out.append("llama.cpp:gpu")
    if vllm:
        out.append("vllm:gpu" if gpus else "vllm:cpu")
    if freetoken_runs(gpus, toolkit, driver, machine or platform.machine()):
        out.append("freetoken:gpu")
    return out


def vllm_allowed(config: Any) -> bool:
    """Whether the agent's configuration (AgentConfig) runs vLLM: its engines.vllm, read as
    it may be (absent in an older configuration; enabled: false where it has that field)."""
    vllm = getattr(getattr(config, "engines", None), "vllm", None)
    return vllm is not None and getattr(vllm, "enabled", True) is not False


def collect(
    state_dir: str,
    gpus: GpuReader | None = None,
    bandwidth: Bandwidth | None = None,
    *,
    vllm: bool = True,
    toolkit: str | None = None,
    models_dir: str = "",
) -> Inventory:
    """The node's inventory now: its cards read through gpus (none without a reader), the
    bandwidth measured at the agent's start (membw.measure) where it was, the CUDA toolkit
    (asked once unless given) and the engines it runs (vLLM unless vllm is False: every
    AgentConfig has engines.vllm, installed when first needed; see vllm_allowed). Its disks:
    those of the state directory, the model cache (models_dir) and /, each filesystem once."""
    mem = meminfo()
    report = gpus.read() if gpus is not None else None
    cards = report.gpus if report else []
    toolkit = installed_toolkit() if toolkit is None else toolkit
    return Inventory(
        cores=cores(),
        memory_bytes=mem.get("MemTotal", 0),
        memory_free_bytes=mem.get("MemAvailable", mem.get("MemFree", 0)),
        disks=disks([p for p in (state_dir, models_dir, "/") if p]),
        gpus=cards,
        gpu_driver_version=report.driver_version if report else "",
        cuda_version=report.cuda_version if report else "",
        memory_bandwidth_bytes_s=bandwidth.all_cores if bandwidth else 0,
        memory_bandwidth_one_core_bytes_s=bandwidth.one_core if bandwidth else 0,
        cuda_toolkit=toolkit,
        engines=engines(cards, toolkit, vllm, driver=report.driver_version if report else ""),
    )
