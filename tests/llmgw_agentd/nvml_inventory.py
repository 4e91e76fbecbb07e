"""Node inventories made of recorded NVML answers (nvml/*.json), and one changed recording."""

from __future__ import annotations

import copy
from typing import Any

from llmgw.wire import Inventory
from llmgw_agentd.gpm import GpmSampler
from llmgw_agentd.gpus import GpuReader
from tests.llmgw_agentd.fake_nvml import FakeNvml


def load(name: str) -> dict[str, Any]:
    """The recording nvml/NAME.json."""
    return FakeNvml.load(name).recording or {}


def recorded(recording: dict[str, Any], toolkit: str = "") -> Inventory:
    """A node's inventory with the cards and driver of an NVML recording, as its second
    report gives it (the first has no GPM counters: they are measured between two)."""
    clock = iter(range(0, 3600, 60))
    reader = GpuReader(FakeNvml(recording), GpmSampler(lambda: float(next(clock))))
    reader.read()
    report = reader.read()
    return Inventory(
        cores=8,
        memory_bytes=64 << 30,
        memory_free_bytes=60 << 30,
        gpus=report.gpus,
        gpu_driver_version=report.driver_version,
        cuda_version=report.cuda_version,
        cuda_toolkit=toolkit,
    )


def pascal() -> dict[str, Any]:
    """The RTX 4090 machine's recording with its cards made GTX 1080 Ti (compute capability
    6.1) and its driver 580.65.06 (CUDA 13.0): a changed recording, not a capture."""
    r = copy.deepcopy(load("rtx4090-8x24gb"))
    r["system"] = {
        "nvmlSystemGetDriverVersion": "580.65.06",
        "nvmlSystemGetCudaDriverVersion": 13000,
    }
    for d in r["devices"]:
        d["nvmlDeviceGetName"] = "NVIDIA GeForce GTX 1080 Ti"
        d["nvmlDeviceGetCudaComputeCapability"] = [6, 1]
    return r


def hopper_mig() -> dict[str, Any]:
    """The A100 MIG recording with its card made an H100 (compute capability 9.0) that reads
    GPM, each MIG instance answering the counters of one of the DCGM-read H100 cards
    (nvml/gpm/dgx-h100-8x80gb.json) in turn: a changed recording, not a capture (no public
    capture of GPM on a Hopper card's MIG instances was found)."""
    r = copy.deepcopy(load("a100-80gb-mig"))
    counters = [d["nvmlGpmMetricsGet"] for d in load("dgx-h100-8x80gb")["devices"][:2]]
    for d in r["devices"]:
        d["nvmlDeviceGetName"] = "NVIDIA H100 80GB HBM3"
        d["nvmlDeviceGetCudaComputeCapability"] = [9, 0]
        d["nvmlGpmQueryDeviceSupport"] = {"isSupportedDevice": 1}
        slots = [s for s in d["mig_devices"] if s is not None]
        for i, slot in enumerate(slots):
            slot["nvmlGpmMetricsGet"] = counters[i % len(counters)]
    return r
