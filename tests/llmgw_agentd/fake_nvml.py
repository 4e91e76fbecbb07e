"""A stand-in for pynvml that replays NVML answers recorded as JSON (see nvml/record.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]

RECORDINGS = Path(__file__).parent / "nvml"


class FakeNvml:
    """Answers each NVML call the way the recorded machine did, errors included.

    A recording holds, per call name, the answer NVML gave, or {"nvml_error": CODE} where it
    failed; the errors raised are pynvml's own classes, so code under test sees what it would
    see on that machine. FakeNvml(None) is a machine without NVIDIA's library.
    """

    NVMLError: type[Exception] = pynvml.NVMLError

    def __init__(self, recording: dict[str, Any] | None) -> None:
        self.recording = recording
        self.calls: list[str] = []
        self.inits = 0

    @classmethod
    def load(cls, name: str) -> FakeNvml:
        """The recording tests/llmgw_agentd/nvml/NAME.json."""
        return cls(json.loads((RECORDINGS / f"{name}.json").read_text()))

    def _answer(self, where: dict[str, Any], call: str) -> Any:
        self.calls.append(call)
        if call not in where:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        value = where[call]
        if isinstance(value, dict) and "nvml_error" in value:
            raise pynvml.NVMLError(value["nvml_error"])
        if isinstance(value, dict):
            return SimpleNamespace(**value)
        if isinstance(value, list) and call == "nvmlDeviceGetCudaComputeCapability":
            return tuple(value)
        return value

    def _started(self) -> dict[str, Any]:
        if self.recording is None or not self.inits:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return self.recording

    def _system(self, call: str) -> Any:
        return self._answer(self._started()["system"], call)

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.recording is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self._system("nvmlSystemGetDriverVersion"))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(self._system("nvmlSystemGetCudaDriverVersion"))

    def nvmlDeviceGetCount(self) -> int:
        self.calls.append("nvmlDeviceGetCount")
        return len(self._started()["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self.calls.append("nvmlDeviceGetHandleByIndex")
        return self._started()["devices"][index]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return str(self._answer(handle, "nvmlDeviceGetUUID"))

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return str(self._answer(handle, "nvmlDeviceGetName"))

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return self._answer(handle, "nvmlDeviceGetMemoryInfo")

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        major, minor = self._answer(handle, "nvmlDeviceGetCudaComputeCapability")
        return int(major), int(minor)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        return list(self._answer(handle, "nvmlDeviceGetMigMode"))

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return int(self._answer(handle, "nvmlDeviceGetMaxMigDeviceCount"))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        self.calls.append("nvmlDeviceGetMigDeviceHandleByIndex")
        slots = handle.get("mig_devices", [])
        if index >= len(slots) or slots[index] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return slots[index]

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return int(self._answer(handle, "nvmlDeviceGetGpuInstanceId"))

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return int(self._answer(handle, "nvmlDeviceGetComputeInstanceId"))

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return self._answer(handle, "nvmlDeviceGetUtilizationRates")

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._answer(handle, "nvmlDeviceGetPowerUsage"))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return int(self._answer(handle, "nvmlDeviceGetEnforcedPowerLimit"))

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return int(self._answer(handle, "nvmlDeviceGetMinorNumber"))
