"""The node's NVIDIA cards and MIG instances, read through NVML (pynvml from nvidia-ml-py)."""

from __future__ import annotations

import importlib
import logging
import re
from typing import Any, NamedTuple, Protocol, cast

from llmgw.wire import Gpu, MigInstance
from llmgw_agentd.gpm import GpmNvml, GpmSampler

log = logging.getLogger(__name__)

# NVML's return codes (nvml.h) that change what we do; any other error is logged.
NOT_SUPPORTED = 3
NOT_FOUND = 6
LIBRARY_NOT_FOUND = 12
DRIVER_NOT_LOADED = 9

_MIG_PROFILE = re.compile(r"\b(\d+g\.\d+gb(?:\+\w+)?)\b")


class Nvml(GpmNvml, Protocol):
    """The part of pynvml this module calls: the real module, or a fake replaying recordings.

    Handles are opaque; structures answered (memory, utilization) are read by attribute.
    """

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int: ...


class GpuReport(NamedTuple):
    """What NVML told: the cards, the driver's version and the newest CUDA it supports."""

    gpus: list[Gpu]
    driver_version: str
    cuda_version: str


NO_GPUS = GpuReport([], "", "")


def cuda_version(v: int) -> str:
    """NVML's CUDA driver version as people write it: 12040 is "12.4"."""
    return f"{v // 1000}.{v % 1000 // 10}" if v > 0 else ""


def mig_profile(name: str) -> str:
    """The profile in a MIG device's name: "NVIDIA A100-SXM4-80GB MIG 3g.40gb" is "3g.40gb"."""
    m = _MIG_PROFILE.search(name)
    return m.group(1) if m else ""


def _code(err: Exception) -> int:
    value = getattr(err, "value", -1)
    return value if isinstance(value, int) else -1


class GpuReader:
    """Reads the cards on every call, initialising NVML once.

    Where NVIDIA's library or driver is missing the node simply has no GPUs: that is said
    once in the log, and every later read answers no GPUs without trying again. Each read
    also answers the profiling counters since the last (gpm.py), where the cards have them.
    """

    def __init__(self, nvml: Nvml | None = None, gpm: GpmSampler | None = None) -> None:
        self._nvml = nvml
        self._gpm = gpm or GpmSampler()
        self._ready = False
        self._absent = False

    def _init(self) -> Nvml | None:
        if self._absent:
            return None
        if self._nvml is None:
            try:
                # Imported here, not at the top: a node without cards never loads it.
                self._nvml = cast(Nvml, importlib.import_module("pynvml"))
            except ImportError:
                log.info("pynvml is not installed: this node reports no GPUs")
                self._absent = True
                return None
        nvml = self._nvml
        if not self._ready:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as e:
                self._absent = True
                if _code(e) in (LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED):
                    log.info("no NVIDIA driver here (%s): this node reports no GPUs", e)
                else:
                    log.warning("NVML did not start (%s): this node reports no GPUs", e)
                return None
            self._ready = True
        return nvml

    def read(self) -> GpuReport:
        """Every card now (with its MIG instances), or no GPUs where there is no driver."""
        nvml = self._init()
        if nvml is None:
            return NO_GPUS
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
            cuda = cuda_version(nvml.nvmlSystemGetCudaDriverVersion())
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            log.warning("NVML could not list the cards: %s", e)
            return NO_GPUS
        gpus: list[Gpu] = []
        for index in range(count):
            try:
                gpus.append(self._card(nvml, index))
            except nvml.NVMLError as e:
                # One card in a bad state (lost, needing a reset) must not hide the others.
                log.warning("NVML could not read card %d: %s", index, e)
        self._gpm.sweep(nvml)
        return GpuReport(gpus, driver, cuda)

    def close(self) -> None:
        """Shut NVML down (the library stays loaded; a later read starts it again)."""
        if self._ready and self._nvml is not None:
            self._ready = False
            self._gpm.close(self._nvml)
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as e:
                log.debug("nvmlShutdown: %s", e)

    def _card(self, nvml: Nvml, index: int) -> Gpu:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(h)
        mig = self._optional(nvml, nvml.nvmlDeviceGetMigMode, h)
        mig_on = bool(mig and mig[0] == 1)
        util = self._optional(nvml, nvml.nvmlDeviceGetUtilizationRates, h)
        minor_number = self._optional(nvml, nvml.nvmlDeviceGetMinorNumber, h)
        uuid = nvml.nvmlDeviceGetUUID(h)
        return Gpu(
            index=index,
            uuid=uuid,
            name=nvml.nvmlDeviceGetName(h),
            memory_total_bytes=int(mem.total),
            memory_free_bytes=int(mem.free),
            compute_capability=f"{major}.{minor}",
            mig=mig_on,
            instances=self._instances(nvml, h, uuid) if mig_on else [],
            utilization_percent=None if util is None else int(util.gpu),
            memory_utilization_percent=None if util is None else int(util.memory),
            power_draw_mw=self._optional(nvml, nvml.nvmlDeviceGetPowerUsage, h),
            power_limit_mw=self._optional(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, h),
            minor=-1 if minor_number is None else int(minor_number),
            counters=None if mig_on else self._gpm.card(nvml, h, uuid),
        )

    def _instances(self, nvml: Nvml, card: Any, card_uuid: str) -> list[MigInstance]:
        out: list[MigInstance] = []
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(card)):
            try:
                h = nvml.nvmlDeviceGetMigDeviceHandleByIndex(card, slot)
            except nvml.NVMLError as e:
                if _code(e) != NOT_FOUND:  # NOT_FOUND: no instance in this slot
                    raise
                continue
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            uuid = nvml.nvmlDeviceGetUUID(h)
            gi = nvml.nvmlDeviceGetGpuInstanceId(h)
            out.append(
                MigInstance(
                    uuid=uuid,
                    gpu_instance_id=gi,
                    compute_instance_id=nvml.nvmlDeviceGetComputeInstanceId(h),
                    profile=mig_profile(nvml.nvmlDeviceGetName(h)),
                    memory_total_bytes=int(mem.total),
                    memory_free_bytes=int(mem.free),
                    counters=self._gpm.instance(nvml, card, card_uuid, gi, uuid),
                )
            )
        return out

    @staticmethod
    def _optional(nvml: Nvml, fn: Any, handle: Any) -> Any:
        """fn(handle), or None where the card does not support it (GeForce, MIG, vGPU)."""
        try:
            return fn(handle)
        except nvml.NVMLError as e:
            if _code(e) != NOT_SUPPORTED:
                log.debug("%s: %s", getattr(fn, "__name__", fn), e)
            return None
