"""GPU inventory through NVML, against recorded answers of an 8-card, a MIG and a GeForce node."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import msgspec
import pytest

from llmgw.wire import Heartbeat, Inventory, decode_agent, encode
from llmgw_agentd import inventory
from llmgw_agentd.gpus import GpuReader, cuda_version, mig_profile
from llmgw_agentd.membw import Bandwidth
from tests.llmgw_agentd.fake_nvml import RECORDINGS, FakeNvml
from tests.llmgw_agentd.nvml.from_nvidia_smi import convert

MIB = 1 << 20


def test_an_eight_card_node_reports_every_card_with_its_own_figures() -> None:
    fake = FakeNvml.load("dgx-h100-8x80gb")
    report = GpuReader(fake).read()
    cards = fake.recording["devices"] if fake.recording else []
    assert [g.index for g in report.gpus] == list(range(8))
    assert len({g.uuid for g in report.gpus}) == 8
    for g, rec in zip(report.gpus, cards, strict=True):
        assert g.uuid == rec["nvmlDeviceGetUUID"] and g.name == "NVIDIA H100 80GB HBM3"
        assert g.memory_total_bytes == rec["nvmlDeviceGetMemoryInfo"]["total"]
        assert g.memory_free_bytes == rec["nvmlDeviceGetMemoryInfo"]["free"]
        assert g.compute_capability == "9.0" and not g.mig and g.instances == []
        assert g.power_limit_mw == 700_000
    # The captured node was idle: 81106 of 81559 MiB free on every card (nvidia-smi's
    # figures), no load, and each card drawing its own power.
    assert {(g.memory_total_bytes // MIB, g.memory_free_bytes // MIB) for g in report.gpus} == {
        (81559, 81106)
    }
    assert all(g.utilization_percent == g.memory_utilization_percent == 0 for g in report.gpus)
    draws = [g.power_draw_mw for g in report.gpus]
    assert draws == [100_890, 82_810, 85_980, 85_480, 84_940, 85_270, 86_050, 75_090]
    assert report.driver_version == "565.57.01" and report.cuda_version == "12.7"


def test_mig_instances_are_places_of_their_own_never_the_whole_card() -> None:
    report = GpuReader(FakeNvml.load("a100-80gb-mig")).read()
    (split,) = report.gpus  # the capture holds the one A100 of its node that is in MIG mode
    assert split.mig and split.memory_total_bytes // MIB == 81920
    assert [i.profile for i in split.instances] == ["1g.20gb"] * 4
    assert all(i.uuid.startswith("MIG-") for i in split.instances)
    assert len({i.uuid for i in split.instances} | {split.uuid}) == 5
    # Each instance has its own memory (19968 MiB, 19955 free, as captured), well under
    # the card's, and together they do not exceed it.
    assert [i.memory_total_bytes // MIB for i in split.instances] == [19968] * 4
    assert [i.memory_free_bytes // MIB for i in split.instances] == [19955] * 4
    assert sum(i.memory_total_bytes for i in split.instances) <= split.memory_total_bytes
    ids = [(i.gpu_instance_id, i.compute_instance_id) for i in split.instances]
    assert ids == [(3, 0), (4, 0), (5, 0), (6, 0)]
    # NVML does not measure utilization on a card in MIG mode: unknown, not 0.
    assert split.utilization_percent is None and split.memory_utilization_percent is None
    assert (split.power_draw_mw, split.power_limit_mw) == (67_030, 500_000)
    assert report.driver_version == "535.54.03" and report.cuda_version == "12.2"


def test_geforce_cards_keep_their_names_sizes_and_capabilities() -> None:
    fake = FakeNvml.load("rtx4090-8x24gb")
    report = GpuReader(fake).read()
    assert {(g.name, g.compute_capability) for g in report.gpus} == {
        ("NVIDIA GeForce RTX 4090", "8.9")
    }
    assert [g.memory_total_bytes // MIB for g in report.gpus] == [24564] * 8
    assert [g.memory_free_bytes // MIB for g in report.gpus] == [24210] * 8
    assert {g.power_limit_mw for g in report.gpus} == {450_000}
    # NVML: MIG not supported on these cards, so no MIG device is ever asked for.
    assert not any(g.mig or g.instances for g in report.gpus)
    assert "nvmlDeviceGetMaxMigDeviceCount" not in fake.calls
    assert report.driver_version == "550.127.05" and report.cuda_version == "12.4"


@pytest.mark.parametrize(
    ("recording", "capture"),
    [
        ("dgx-h100-8x80gb", "h100-80gb-hbm3-8x_565.57.01.nvidia-smi-q.txt"),
        ("a100-80gb-mig", "a100-sxm4-80gb-mig_535.54.03.nvidia-smi-q-x.xml"),
        ("rtx4090-8x24gb", "rtx4090-8x_550.127.05.nvidia-smi-q.txt"),
    ],
)
def test_each_recording_is_its_real_capture_converted(recording: str, capture: str) -> None:
    # The recordings are nvidia-smi captures of real machines (nvml/captures/README.md),
    # converted by nvml/from_nvidia_smi.py: converting again gives the same answers.
    rec = json.loads((RECORDINGS / f"{recording}.json").read_text())
    again = convert(RECORDINGS / "captures" / capture, "")
    assert (again["system"], again["devices"]) == (rec["system"], rec["devices"])
    assert f"stored as captures/{capture}" in rec["provenance"]
    assert rec["provenance"].startswith("Converted by tests/llmgw_agentd/nvml/from_nvidia_smi.py")


def test_without_nvidias_library_the_node_has_no_gpus_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeNvml(None)
    reader = GpuReader(fake)
    with caplog.at_level(logging.INFO, logger="llmgw_agentd.gpus"):
        reports = [reader.read() for _ in range(3)]
    assert all(r.gpus == [] and r.driver_version == "" for r in reports)
    assert len([r for r in caplog.records if "no GPUs" in r.getMessage()]) == 1
    assert fake.calls.count("nvmlInit") == 1


def test_the_real_pynvml_runs_the_same_code_path() -> None:
    # The real module: without NVIDIA's library (as here) no GPUs and no driver; on a GPU
    # machine, every card with its own UUID and memory.
    report = GpuReader().read()
    if not report.driver_version:
        assert report.gpus == []
    assert all(g.uuid.startswith("GPU-") and g.memory_total_bytes > 0 for g in report.gpus)


def test_one_card_in_a_bad_state_does_not_hide_the_others() -> None:
    rec = json.loads((RECORDINGS / "rtx4090-8x24gb.json").read_text())
    rec["devices"][0]["nvmlDeviceGetMemoryInfo"] = {"nvml_error": 15}  # GPU is lost
    report = GpuReader(FakeNvml(rec)).read()
    assert [g.index for g in report.gpus] == list(range(1, 8))
    assert [g.uuid for g in report.gpus] == [d["nvmlDeviceGetUUID"] for d in rec["devices"][1:]]


def test_nvml_versions_and_mig_names_read_as_people_write_them() -> None:
    assert cuda_version(12040) == "12.4" and cuda_version(11080) == "11.8"
    assert mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb") == "1g.10gb"
    assert mig_profile("NVIDIA A100-SXM4-40GB MIG 1g.5gb+me") == "1g.5gb+me"


def test_an_inventory_with_gpus_goes_over_the_wire_and_an_old_one_still_decodes() -> None:
    report = GpuReader(FakeNvml.load("a100-80gb-mig")).read()
    inv = Inventory(
        cores=64,
        memory_bytes=1 << 40,
        memory_free_bytes=1 << 39,
        gpus=report.gpus,
        gpu_driver_version=report.driver_version,
        cuda_version=report.cuda_version,
        memory_bandwidth_bytes_s=200_000_000_000,
        memory_bandwidth_one_core_bytes_s=20_000_000_000,
    )
    back = decode_agent(encode(Heartbeat(inventory=inv)))
    assert isinstance(back, Heartbeat) and back.inventory == inv
    old = b'{"type":"heartbeat","inventory":{"cores":2,"memory_bytes":1,"memory_free_bytes":1}}'
    decoded = decode_agent(old)
    assert isinstance(decoded, Heartbeat)
    assert decoded.inventory.gpus == [] and decoded.inventory.memory_bandwidth_bytes_s == 0
    with pytest.raises(msgspec.ValidationError):
        decode_agent(old.replace(b'"cores":2', b'"cores":2,"gpus":[{"index":"x"}]'))


def test_the_agents_inventory_carries_its_cards_and_bandwidth(tmp_path: Path) -> None:
    inv = inventory.collect(
        str(tmp_path), GpuReader(FakeNvml.load("dgx-h100-8x80gb")), Bandwidth(20, 200)
    )
    assert len(inv.gpus) == 8 and inv.cuda_version == "12.7"
    assert (inv.memory_bandwidth_one_core_bytes_s, inv.memory_bandwidth_bytes_s) == (20, 200)
    assert inv.cores >= 1 and inv.memory_bytes > 0
    bare = inventory.collect(str(tmp_path))
    assert bare.gpus == [] and bare.memory_bandwidth_bytes_s == 0
