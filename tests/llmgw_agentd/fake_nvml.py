"""A stand-in for pynvml that replays NVML answers recorded as JSON (see nvml/record.py), GPM's
profiling counters included (nvml/gpm/NAME.json where they came apart from the capture)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]

RECORDINGS = Path(__file__).parent / "nvml"
GPM_SLOTS = 16  # the metrics one nvmlGpmMetricsGet may ask here (pynvml's struct has 477)


class FakeGpmSample:
    """A GPM sample: the counters recorded for what it was taken of."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] | None = None


class FakeGpmMetricsGet:
    """pynvml's c_nvmlGpmMetricsGet_t, as plain attributes."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: FakeGpmSample | None = None
        self.sample2: FakeGpmSample | None = None
        self.metrics = [
            SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(GPM_SLOTS)
        ]


def with_gpm(recording: dict[str, Any], gpm: dict[str, Any]) -> dict[str, Any]:
    """The recording with GPM's answers of nvml/gpm/NAME.json laid over its cards (by index)
    and their MIG slots."""
    for card, extra in zip(recording["devices"], gpm["devices"], strict=False):
        slots = extra.get("mig_devices", [])
        card.update({k: v for k, v in extra.items() if k != "mig_devices"})
        for slot, more in zip(card.get("mig_devices", []), slots, strict=False):
            if slot is not None and more:
                slot.update(more)
    recording["provenance"] += " GPM's answers: " + gpm["provenance"]
    return recording


class FakeNvml:
    """Answers each NVML call the way the recorded machine did, errors included.

    A recording holds, per call name, the answer NVML gave, or {"nvml_error": CODE} where it
    failed; the errors raised are pynvml's own classes, so code under test sees what it would
    see on that machine. FakeNvml(None) is a machine without NVIDIA's library.
    """

    NVMLError: type[Exception] = pynvml.NVMLError
    NVML_GPM_METRICS_GET_VERSION: int = pynvml.NVML_GPM_METRICS_GET_VERSION
    c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet

    def __init__(self, recording: dict[str, Any] | None) -> None:
        self.recording = recording
        self.calls: list[str] = []
        self.inits = 0
        self.samples_held = 0  # GPM samples allocated and not yet freed

    @classmethod
    def load(cls, name: str) -> FakeNvml:
        """The recording tests/llmgw_agentd/nvml/NAME.json, with nvml/gpm/NAME.json's GPM
        answers where there is one."""
        recording = json.loads((RECORDINGS / f"{name}.json").read_text())
        gpm = RECORDINGS / "gpm" / f"{name}.json"
        if gpm.is_file():
            recording = with_gpm(recording, json.loads(gpm.read_text()))
        return cls(recording)

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

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        return self._answer(handle, "nvmlGpmQueryDeviceSupport")

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:
        self.calls.append("nvmlGpmSampleAlloc")
        self.samples_held += 1
        return FakeGpmSample()

    def nvmlGpmSampleFree(self, sample: FakeGpmSample) -> None:
        self.calls.append("nvmlGpmSampleFree")
        self.samples_held -= 1

    def nvmlGpmSampleGet(self, handle: Any, sample: FakeGpmSample) -> FakeGpmSample:
        return self._sample(handle, sample, "nvmlGpmSampleGet")

    def nvmlGpmMigSampleGet(
        self, handle: Any, gpu_instance_id: int, sample: FakeGpmSample
    ) -> FakeGpmSample:
        slots = [s for s in handle.get("mig_devices", []) if s is not None]
        for slot in slots:
            if slot.get("nvmlDeviceGetGpuInstanceId") == gpu_instance_id:
                return self._sample(slot, sample, "nvmlGpmMigSampleGet")
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def _sample(self, where: dict[str, Any], sample: FakeGpmSample, call: str) -> FakeGpmSample:
        self.calls.append(call)
        failed = where.get(call)
        if isinstance(failed, dict) and "nvml_error" in failed:
            raise pynvml.NVMLError(failed["nvml_error"])
        sample.answers = where.get("nvmlGpmMetricsGet", {})
        return sample

    def nvmlGpmMetricsGet(self, request: FakeGpmMetricsGet) -> FakeGpmMetricsGet:
        """Each metric asked as recorded for the second sample's card or instance (what
        NVML measured over one interval there); one not recorded is NOT_SUPPORTED."""
        self.calls.append("nvmlGpmMetricsGet")
        assert request.sample1 is not None and request.sample2 is not None
        answers = request.sample2.answers or {}
        for metric in request.metrics[: request.numMetrics]:
            got = answers.get(str(metric.metricId))
            if got is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            elif isinstance(got, dict):
                metric.nvmlReturn = got["nvml_error"]
            else:
                metric.nvmlReturn, metric.value = 0, float(got)
        return request
