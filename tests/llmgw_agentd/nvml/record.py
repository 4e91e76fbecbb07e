"""Record this machine's NVML answers as JSON, in the form tests/llmgw_agentd/fake_nvml.py replays.

Run where the cards are: `python record.py "who ran it, where, when" > NAME.json`. Only pynvml
(nvidia-ml-py) is needed. UUIDs are recorded as NVML gives them; edit them out if a site's
card identities must not be published. Where a card reads GPM (Hopper and later), the profiling
counters llmgw reads are recorded over one second, for the card or for each MIG instance
(about a second a card or instance).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pynvml  # type: ignore[import-untyped]

CARD_CALLS = [
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMinorNumber",
]
MIG_CALLS = [
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
]
FIELDS = {
    "nvmlDeviceGetMemoryInfo": ("total", "free", "used"),
    "nvmlDeviceGetUtilizationRates": ("gpu", "memory"),
    "nvmlGpmQueryDeviceSupport": ("isSupportedDevice",),
}
# GPM's SM_UTIL, SM_OCCUPANCY, ANY_TENSOR_UTIL and DRAM_BW_UTIL (llmgw_agentd/gpm.py's METRICS).
GPM_METRICS = (2, 3, 5, 10)


def answer(call: str, fn: Callable[..., Any], *args: Any) -> Any:
    """What NVML answered, as JSON: a value, a structure's fields, or the error's code."""
    try:
        value = fn(*args)
    except pynvml.NVMLError as e:
        return {"nvml_error": e.value}
    if call in FIELDS:
        return {f: getattr(value, f) for f in FIELDS[call]}
    if isinstance(value, tuple):
        return list(value)
    return value


def gpm(take: Callable[[Any], Any], call: str) -> dict[str, Any]:
    """GPM's answers over one second, as the replay gives them: each counter's value or error,
    or the sample call's error."""
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    try:
        take(first)
        time.sleep(1.0)
        take(second)
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = first, second
        for i, metric in enumerate(GPM_METRICS):
            request.metrics[i].metricId = metric
        pynvml.nvmlGpmMetricsGet(request)
    except pynvml.NVMLError as e:
        return {call: {"nvml_error": e.value}}
    finally:
        pynvml.nvmlGpmSampleFree(first)
        pynvml.nvmlGpmSampleFree(second)
    got = request.metrics[: len(GPM_METRICS)]
    return {
        "nvmlGpmMetricsGet": {
            str(m.metricId): m.value if m.nvmlReturn == 0 else {"nvml_error": m.nvmlReturn}
            for m in got
        }
    }


def mig_slots(h: Any, profiled: bool) -> list[dict[str, Any] | None]:
    """The answers of each MIG slot of card h (None: no instance there)."""
    slots: list[dict[str, Any] | None] = []
    for s in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, s)
        except pynvml.NVMLError:
            slots.append(None)
            continue
        slot = {c: answer(c, getattr(pynvml, c), m) for c in MIG_CALLS}
        gi = slot["nvmlDeviceGetGpuInstanceId"]
        if profiled and isinstance(gi, int):
            take = partial(pynvml.nvmlGpmMigSampleGet, h, gi)
            slot.update(gpm(take, "nvmlGpmMigSampleGet"))
        slots.append(slot)
    return slots


def record(provenance: str) -> dict[str, Any]:
    """Every answer this module's calls get on this machine."""
    pynvml.nvmlInit()
    out: dict[str, Any] = {"provenance": provenance, "system": {}, "devices": []}
    for call in ("nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion"):
        out["system"][call] = answer(call, getattr(pynvml, call))
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        card = {c: answer(c, getattr(pynvml, c), h) for c in CARD_CALLS}
        support = answer("nvmlGpmQueryDeviceSupport", pynvml.nvmlGpmQueryDeviceSupport, h)
        card["nvmlGpmQueryDeviceSupport"] = support
        profiled = support.get("isSupportedDevice") == 1
        mig = card["nvmlDeviceGetMigMode"]
        mig_on = isinstance(mig, list) and mig[0] == 1
        if profiled and not mig_on:
            card.update(gpm(partial(pynvml.nvmlGpmSampleGet, h), "nvmlGpmSampleGet"))
        card["mig_devices"] = mig_slots(h, profiled) if mig_on else []
        out["devices"].append(card)
    pynvml.nvmlShutdown()
    return out


if __name__ == "__main__":
    json.dump(record(" ".join(sys.argv[1:]) or "recorded"), sys.stdout, indent=1)
    print()
