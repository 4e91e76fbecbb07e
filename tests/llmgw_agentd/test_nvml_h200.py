"""The agent's view of a real H200, replayed from NVML's answers that record.py recorded on one
(nvml/h200-1x141gb.json, scripts/gpu-check's step 1): the card, its GPM counters, and where
llama.cpp runs on it (the CUDA build's directory as build-llama-server named it there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmgw_agentd import inventory
from llmgw_agentd.engines import llamacpp
from llmgw_agentd.gpm import GpmSampler
from llmgw_agentd.gpus import GpuReader
from tests.llmgw_agentd.fake_nvml import RECORDINGS, FakeNvml

NAME = "h200-1x141gb"
MIB = 1 << 20


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_h200_reads_as_one_idle_hopper_card_with_its_own_figures() -> None:
    report = GpuReader(FakeNvml.load(NAME)).read()
    (card,) = report.gpus
    assert (card.index, card.name, card.compute_capability) == (0, "NVIDIA H200", "9.0")
    # nvidia-smi on that machine: 143771 MiB; NVML's free and used, as recorded.
    assert card.memory_total_bytes // MIB == 143771
    assert card.memory_free_bytes == 150_109_880_320
    assert not card.mig and card.instances == []
    assert (card.power_draw_mw, card.power_limit_mw) == (78_813, 700_000)
    assert card.utilization_percent == card.memory_utilization_percent == 0
    assert card.uuid.startswith("GPU-")
    assert (report.driver_version, report.cuda_version) == ("580.159.04", "13.0")


def test_the_h200s_gpm_counters_come_in_the_second_report() -> None:
    fake = FakeNvml.load(NAME)
    clock = Clock()
    gpus = GpuReader(fake, GpmSampler(clock))
    assert [g.counters for g in gpus.read().gpus] == [None]  # one sample is no interval
    clock.now = 30.0
    (card,) = gpus.read().gpus
    recorded = json.loads((RECORDINGS / f"{NAME}.json").read_text())
    dram = recorded["devices"][0]["nvmlGpmMetricsGet"]["10"]
    assert card.counters is not None
    got = (card.counters.sm_active_percent, card.counters.sm_occupancy_percent,
           card.counters.tensor_active_percent, card.counters.dram_active_percent)  # fmt: skip
    assert got[:3] == (0.0, 0.0, 0.0) and got[3] == pytest.approx(dram)  # idle: DRAM barely used
    assert 0 < dram < 0.01
    assert fake.calls.count("nvmlGpmMetricsGet") == 1  # one card, one interval
    gpus.close()
    assert fake.samples_held == 0


def test_llama_cpp_runs_on_the_h200_once_built_for_sm90_with_cuda_13(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_CACHE", str(tmp_path))
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    gpus = GpuReader(FakeNvml.load(NAME)).read().gpus
    assert inventory.engines(gpus, "13.0", False, can_build=False) == ["llama.cpp:cpu"]
    # The directory build-llama-server --cuda made on that machine (CUDA 13.0, sm_90).
    built = tmp_path / "llama.cpp" / f"{llamacpp.VERSION}-x86_64-cuda13.0-sm90"
    built.mkdir(parents=True)
    (built / "llama-server").write_text("")
    assert inventory.engines(gpus, "13.0", False, can_build=False) == [
        "llama.cpp:cpu",
        "llama.cpp:gpu",
    ]
    # A build for another toolkit is not this one.
    assert inventory.engines(gpus, "12.4", False, can_build=False) == ["llama.cpp:cpu"]
