"""Record this machine's NVML answers as JSON, in the form tests/llmgw_agentd/fake_nvml.py replays.

Run where the cards are: `python record.py "who ran it, where, when" > NAME.json`. Only pynvml
(nvidia-ml-py) is needed. UUIDs are recorded as NVML gives them; edit them out if a site's
card identities must not be published.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
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
}


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


def record(provenance: str) -> dict[str, Any]:
    """Every answer this module's calls get on this machine."""
    pynvml.nvmlInit()
    out: dict[str, Any] = {"provenance": provenance, "system": {}, "devices": []}
    for call in ("nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion"):
        out["system"][call] = answer(call, getattr(pynvml, call))
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        card = {c: answer(c, getattr(pynvml, c), h) for c in CARD_CALLS}
        slots: list[dict[str, Any] | None] = []
        mig = card["nvmlDeviceGetMigMode"]
        if isinstance(mig, list) and mig[0] == 1:
            for s in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                try:
                    m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, s)
                except pynvml.NVMLError:
                    slots.append(None)
                    continue
                slots.append({c: answer(c, getattr(pynvml, c), m) for c in MIG_CALLS})
        card["mig_devices"] = slots
        out["devices"].append(card)
    pynvml.nvmlShutdown()
    return out


if __name__ == "__main__":
    json.dump(record(" ".join(sys.argv[1:]) or "recorded"), sys.stdout, indent=1)
    print()
