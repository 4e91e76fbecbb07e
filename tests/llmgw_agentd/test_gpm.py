"""GPM's profiling counters (SMs, occupancy, tensor cores, DRAM) in each report, against the
recorded readings of real H100 cards, a card in MIG mode and cards without GPM."""

from __future__ import annotations

import copy
import json
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest

from llmgw.wire import GpuCounters, Heartbeat, Inventory, decode_agent, encode
from llmgw_agentd.gpm import GpmSampler, measure
from llmgw_agentd.gpus import GpuReader
from tests.llmgw_agentd.fake_nvml import RECORDINGS, FakeNvml
from tests.llmgw_agentd.nvml import record
from tests.llmgw_agentd.nvml.from_dcgm import convert
from tests.llmgw_agentd.nvml_inventory import hopper_mig, load

# DCGM's readings of the two H100 cards in captures/h100-80gb-hbm3-2x_dcgm-prof.pydcgm.txt
# (sm_active, sm_occupancy, tensor_active, dram_active), as ratios.
H100_0 = (0.9125968658836753, 0.24450015849762033, 0.2793637431083633, 0.21368455905985453)
H100_1 = (0.9322035653753363, 0.24773293430776908, 0.2830590854513563, 0.1826625855083514)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ratios(c: GpuCounters | None) -> tuple[float | None, ...] | None:
    if c is None:
        return None
    fields = (c.sm_active_percent, c.sm_occupancy_percent, c.tensor_active_percent,
              c.dram_active_percent)  # fmt: skip
    return tuple(None if f is None else f / 100 for f in fields)


def reader(fake: FakeNvml) -> tuple[GpuReader, Clock]:
    clock = Clock()
    return GpuReader(fake, GpmSampler(clock)), clock


def test_each_report_gives_the_h100s_counters_over_the_interval_since_the_last() -> None:
    fake = FakeNvml.load("dgx-h100-8x80gb")
    gpus, clock = reader(fake)
    first = gpus.read()
    # One sample is no interval: the first report has no counters.
    assert [g.counters for g in first.gpus] == [None] * 8
    clock.now = 30.0
    second = gpus.read()
    got = [ratios(g.counters) for g in second.gpus]
    assert got[0] == pytest.approx(H100_0) and got[1] == pytest.approx(H100_1)
    # The other six cards have no GPM answers recorded: no counters, not zeros.
    assert got[2:] == [None] * 6
    assert fake.calls.count("nvmlGpmMetricsGet") == 2
    # Each profiled card keeps one sample between reports, the older one freed.
    assert fake.samples_held == 2
    gpus.close()
    assert fake.samples_held == 0


@pytest.mark.parametrize("name", ["a100-80gb-mig", "rtx4090-8x24gb"])
def test_cards_without_gpm_have_no_counters_and_are_asked_once(name: str) -> None:
    fake = FakeNvml.load(name)
    gpus, clock = reader(fake)
    for step in range(3):
        clock.now = 30.0 * step
        report = gpus.read()
    assert all(g.counters is None for g in report.gpus)
    assert all(i.counters is None for g in report.gpus for i in g.instances)
    assert fake.calls.count("nvmlGpmQueryDeviceSupport") == len(report.gpus)
    assert "nvmlGpmSampleAlloc" not in fake.calls


def test_each_mig_instance_has_its_own_counters_and_the_card_none() -> None:
    fake = FakeNvml(hopper_mig())
    gpus, clock = reader(fake)
    gpus.read()
    clock.now = 30.0
    (card,) = gpus.read().gpus
    assert card.mig and card.counters is None
    got = [ratios(i.counters) for i in card.instances]
    assert got == [pytest.approx(H100_0), pytest.approx(H100_1)] * 2
    # Sampled through the card's GPU instances, never as the whole card.
    assert fake.calls.count("nvmlGpmMigSampleGet") == 8
    assert "nvmlGpmSampleGet" not in fake.calls


def test_reports_within_a_second_answer_the_last_counters_without_sampling() -> None:
    fake = FakeNvml.load("dgx-h100-8x80gb")
    gpus, clock = reader(fake)
    gpus.read()
    clock.now = 30.0
    counters = gpus.read().gpus[0].counters
    allocated = fake.calls.count("nvmlGpmSampleAlloc")
    clock.now = 30.2
    assert gpus.read().gpus[0].counters == counters
    assert fake.calls.count("nvmlGpmSampleAlloc") == allocated


def test_a_card_gone_frees_its_sample_and_a_failed_sample_gives_none() -> None:
    rec = load("dgx-h100-8x80gb")
    fake = FakeNvml(rec)
    gpus, clock = reader(fake)
    gpus.read()
    assert fake.samples_held == 2
    rec["devices"][0]["nvmlGpmSampleGet"] = {"nvml_error": 15}  # GPU is lost
    del rec["devices"][1]
    clock.now = 30.0
    report = gpus.read()
    assert report.gpus[0].counters is None
    # Card 0's last good sample is kept; the card no longer listed has its sample freed.
    assert fake.samples_held == 1


def test_counters_go_over_the_wire_and_an_older_agents_cards_decode_without() -> None:
    gpus, clock = reader(FakeNvml.load("dgx-h100-8x80gb"))
    gpus.read()
    clock.now = 30.0
    inv = Inventory(cores=1, memory_bytes=1, memory_free_bytes=1, gpus=gpus.read().gpus)
    back = decode_agent(encode(Heartbeat(inventory=inv)))
    assert isinstance(back, Heartbeat) and back.inventory == inv
    assert ratios(back.inventory.gpus[0].counters) == pytest.approx(H100_0)
    old = {"index": 0, "uuid": "GPU-1", "name": "x", "memory_total_bytes": 1,
           "memory_free_bytes": 1, "compute_capability": "9.0"}  # fmt: skip
    body = {"type": "heartbeat", "inventory": {"cores": 1, "memory_bytes": 1,
            "memory_free_bytes": 1, "gpus": [old]}}  # fmt: skip
    decoded = decode_agent(json.dumps(body).encode())
    assert isinstance(decoded, Heartbeat) and decoded.inventory.gpus[0].counters is None


def test_the_gpm_answers_are_their_real_capture_converted() -> None:
    rec = json.loads((RECORDINGS / "gpm" / "dgx-h100-8x80gb.json").read_text())
    capture = RECORDINGS / "captures" / "h100-80gb-hbm3-2x_dcgm-prof.pydcgm.txt"
    assert convert(capture, "")["devices"] == rec["devices"]
    assert "https://github.com/guilbaults/slurm-job-exporter/issues/30" in rec["provenance"]


def test_record_py_records_the_gpm_answers_as_the_replay_gives_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # record.py run against the replay of a Hopper card in MIG mode and of the H100s
    # records the same GPM answers: what it writes on a real card replays as recorded.
    for recording in (hopper_mig(), load("dgx-h100-8x80gb")):
        fake = FakeNvml(copy.deepcopy(recording))
        for name in dir(fake):
            if name.startswith(("nvml", "c_nvml", "NVML_GPM")):
                monkeypatch.setattr(pynvml, name, getattr(fake, name))
        monkeypatch.setattr("time.sleep", lambda s: None)
        out = record.record("test")
        assert fake.samples_held == 0
        for again, card in zip(out["devices"], recording["devices"], strict=True):
            assert again.get("nvmlGpmMetricsGet") == card.get("nvmlGpmMetricsGet")
            slots = zip(again["mig_devices"], card["mig_devices"], strict=True)
            for a, c in slots:
                assert (a or {}).get("nvmlGpmMetricsGet") == (c or {}).get("nvmlGpmMetricsGet")


def test_the_request_is_pynvmls_own_struct_filled_as_nvml_reads_it() -> None:
    # On a real card the request is pynvml's ctypes struct and the samples its pointers:
    # measure() fills and reads that struct (NVML itself answers through it in place).
    class Nvml(FakeNvml):
        c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t

        def nvmlGpmMetricsGet(self, request: Any) -> Any:
            assert request.version == 1 and request.numMetrics == 4
            asked = [request.metrics[i].metricId for i in range(4)]
            assert asked == [2, 3, 5, 10]
            for i, value in enumerate((91.25, 24.45, 0.0)):
                request.metrics[i].value = value
            request.metrics[3].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            return request

    got = measure(Nvml(None), pynvml.c_nvmlGpmSample_t(), pynvml.c_nvmlGpmSample_t())
    assert got == GpuCounters(91.25, 24.45, 0.0, None)


def test_a_reader_for_placement_only_samples_no_counters() -> None:
    # Replicas' own reader (cards for placement) keeps no GPM samples beside the reports'.
    fake = FakeNvml.load("dgx-h100-8x80gb")
    clock = Clock()
    gpus = GpuReader(fake, GpmSampler(clock, on=False))
    for step in range(3):
        clock.now = 30.0 * step
        report = gpus.read()
    assert len(report.gpus) == 8 and all(g.counters is None for g in report.gpus)
    assert not any(c.startswith("nvmlGpm") for c in fake.calls)
