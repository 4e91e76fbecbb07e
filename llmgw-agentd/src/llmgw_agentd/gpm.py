"""Each card's profiling counters through NVML's GPM (Hopper and later): SMs active, SM
occupancy, tensor cores and DRAM active over the interval between two reads, each MIG
instance apart."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from llmgw.wire import GpuCounters

log = logging.getLogger(__name__)

# nvml.h's nvmlGpmMetricId_t: the four counters asked, in GpuCounters' order.
SM_UTIL = 2
SM_OCCUPANCY = 3
ANY_TENSOR_UTIL = 5
DRAM_BW_UTIL = 10
METRICS = (SM_UTIL, SM_OCCUPANCY, ANY_TENSOR_UTIL, DRAM_BW_UTIL)
SUCCESS = 0
# Reads closer together than this (a heartbeat and a poke at once) answer the last counters:
# GPM's figures over a few milliseconds say little.
MIN_INTERVAL_S = 1.0


class GpmNvml(Protocol):
    """The part of pynvml's GPM API used here (nvidia-ml-py's names)."""

    NVMLError: type[Exception]
    NVML_GPM_METRICS_GET_VERSION: int

    def c_nvmlGpmMetricsGet_t(self) -> Any: ...  # pynvml's struct, made by calling it
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any: ...
    def nvmlGpmSampleAlloc(self) -> Any: ...
    def nvmlGpmSampleFree(self, sample: Any) -> None: ...
    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any: ...
    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any: ...
    def nvmlGpmMetricsGet(self, request: Any) -> Any: ...


class _Last(NamedTuple):
    sample: Any
    at: float
    counters: GpuCounters | None


class GpmSampler:
    """Keeps each card's (or MIG instance's) last GPM sample, so that each read answers the
    counters since the one before; a first read answers none. A card without GPM (before
    Hopper, an older driver) answers none, asked once per card."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, on: bool = True) -> None:
        self._clock = clock
        self._on = on  # off: a reader that wants the cards only (placement) samples nothing
        self._supported: dict[str, bool] = {}
        self._last: dict[str, _Last] = {}
        self._seen: set[str] = set()

    def card(self, nvml: GpmNvml, handle: Any, uuid: str) -> GpuCounters | None:
        """The card's counters since the last read (None: not told)."""
        if not self.supported(nvml, handle, uuid):
            return None
        return self._read(nvml, uuid, lambda s: nvml.nvmlGpmSampleGet(handle, s))

    def instance(
        self, nvml: GpmNvml, card: Any, card_uuid: str, gpu_instance_id: int, uuid: str
    ) -> GpuCounters | None:
        """A MIG instance's counters since the last read, from its card's GPU instance."""
        if not self.supported(nvml, card, card_uuid):
            return None
        return self._read(nvml, uuid, lambda s: nvml.nvmlGpmMigSampleGet(card, gpu_instance_id, s))

    def supported(self, nvml: GpmNvml, handle: Any, uuid: str) -> bool:
        """Whether the card reads GPM counters (asked once)."""
        if not self._on:
            return False
        if uuid not in self._supported:
            try:
                ok = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            except nvml.NVMLError as e:
                log.debug("no GPM on %s: %s", uuid, e)
                ok = False
            self._supported[uuid] = ok
        return self._supported[uuid]

    def sweep(self, nvml: GpmNvml) -> None:
        """Free the samples of what this round of reads did not see (a card lost, a MIG
        instance destroyed)."""
        for key in set(self._last) - self._seen:
            _free(nvml, self._last.pop(key).sample)
        self._seen.clear()

    def close(self, nvml: GpmNvml) -> None:
        """Free every sample (before NVML shuts down)."""
        self._seen.clear()
        self.sweep(nvml)

    def _read(self, nvml: GpmNvml, key: str, get: Callable[[Any], Any]) -> GpuCounters | None:
        self._seen.add(key)
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last.at < MIN_INTERVAL_S:
            return last.counters
        try:
            sample = nvml.nvmlGpmSampleAlloc()
        except nvml.NVMLError as e:
            log.debug("GPM sample for %s: %s", key, e)
            return None
        try:
            get(sample)
            counters = None if last is None else measure(nvml, last.sample, sample)
        except nvml.NVMLError as e:
            log.debug("GPM counters of %s: %s", key, e)
            _free(nvml, sample)
            return None
        if last is not None:
            _free(nvml, last.sample)
        self._last[key] = _Last(sample, now, counters)
        return counters


def measure(nvml: GpmNvml, first: Any, second: Any) -> GpuCounters | None:
    """The four counters between two samples; a counter NVML refuses is None."""
    request = nvml.c_nvmlGpmMetricsGet_t()
    request.version = nvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(METRICS)
    request.sample1 = first
    request.sample2 = second
    for i, metric in enumerate(METRICS):
        request.metrics[i].metricId = metric
    nvml.nvmlGpmMetricsGet(request)
    values: list[float | None] = []
    for i in range(len(METRICS)):
        got = request.metrics[i]
        values.append(float(got.value) if got.nvmlReturn == SUCCESS else None)
    if all(v is None for v in values):
        return None
    sm, occupancy, tensor, dram = values
    return GpuCounters(
        sm_active_percent=sm,
        sm_occupancy_percent=occupancy,
        tensor_active_percent=tensor,
        dram_active_percent=dram,
    )


def _free(nvml: GpmNvml, sample: Any) -> None:
    try:
        nvml.nvmlGpmSampleFree(sample)
    except nvml.NVMLError as e:
        log.debug("nvmlGpmSampleFree: %s", e)
