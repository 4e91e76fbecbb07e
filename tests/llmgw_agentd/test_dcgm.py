"""Profiling counters from a dcgm-exporter on the node, for cards GPM gives none: against the
output of a real exporter on A30 cards in MIG mode (nvml/captures/)."""

from __future__ import annotations

import copy
import logging

import aiohttp
import msgspec
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from llmgw import config
from llmgw.wire import GpuCounters, Inventory
from llmgw_agentd import dcgm
from llmgwd.metrics.gpus import GpuCollector
from tests.llmgw_agentd.fake_nvml import RECORDINGS
from tests.llmgw_agentd.nvml_inventory import load, recorded
from tests.llmgwd.test_metrics import node, samples

CAPTURE = RECORDINGS / "captures" / "a30-2x-mig_dcgm-exporter.metrics.txt"
A30_0 = "GPU-265c9814-6156-355b-e589-ff2064894f16"
A30_1 = "GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49"
IDLE = GpuCounters(0.0, 0.0, 0.0, 0.0)


def test_the_exporters_counters_are_read_by_card_and_gpu_instance() -> None:
    found = dcgm.parse(CAPTURE.read_text())
    assert set(found) == {(A30_0, 3), (A30_0, 4), (A30_0, 5), (A30_0, 6), (A30_1, 3), (A30_1, 4)}
    # The idle instances read 0 (a measured 0, not an unknown).
    assert all(found[(A30_0, gi)] == IDLE for gi in (3, 4, 5, 6))
    # The capture stops before card 1's last tensor line: that counter is unknown.
    assert found[(A30_1, 4)] == GpuCounters(0.0, 0.0, None, 0.0)


def a30_mig() -> Inventory:
    """The A100 MIG recording (GPU instances 3 to 6) with the captured A30's UUID: a changed
    recording, so that the exporter's rows name its card."""
    r = copy.deepcopy(load("a100-80gb-mig"))
    r["devices"][0]["nvmlDeviceGetUUID"] = A30_0
    r["devices"][0]["nvmlDeviceGetName"] = "NVIDIA A30"
    return recorded(r)


def test_mig_instances_take_the_exporters_counters_and_gpms_are_kept() -> None:
    counters = dcgm.parse(CAPTURE.read_text())
    (card,) = dcgm.fill(a30_mig().gpus, counters)
    assert card.counters is None  # a card in MIG mode: only through its instances
    assert [i.counters for i in card.instances] == [IDLE] * 4
    # A card GPM measured keeps GPM's counters; one the exporter does not name has none.
    h100 = recorded(load("dgx-h100-8x80gb")).gpus
    named = {**counters, (h100[0].uuid, None): IDLE}
    filled = dcgm.fill(h100, named)
    assert filled[0].counters == h100[0].counters and filled[0].counters != IDLE
    assert [g.counters for g in filled[2:]] == [None] * 6
    # What a user reads on /metrics: each instance its own series.
    inv = msgspec.structs.replace(a30_mig(), gpus=[card])
    registry = CollectorRegistry()
    registry.register(GpuCollector(lambda: [node("a30", inv)]))
    found = samples(registry)
    rows = {k: v for k, v in found.items() if k[0] == "llmgw_mig_sm_active_ratio"}
    assert len(rows) == 4 and set(rows.values()) == {0.0}
    assert not [k for k in found if k[0] == "llmgw_gpu_sm_active_ratio"]


async def test_the_exporter_is_read_over_http_and_its_absence_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=CAPTURE.read_text())

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    exporter = dcgm.Exporter(f"http://127.0.0.1:{port}/metrics")
    async with aiohttp.ClientSession() as http:
        await exporter.read(http)
        assert exporter.counters == dcgm.parse(CAPTURE.read_text())
        await runner.cleanup()
        with caplog.at_level(logging.WARNING, logger="llmgw_agentd.dcgm"):
            await exporter.read(http)
            await exporter.read(http)
    assert exporter.counters == {}
    assert len([r for r in caplog.records if "did not answer" in r.getMessage()]) == 1


def test_the_setting_takes_a_loopback_url_only_and_never_shows_a_password() -> None:
    ok = config.parse("dcgm_exporter: http://127.0.0.1:9400/metrics", config.AgentConfig)
    assert ok.dcgm_exporter == "http://127.0.0.1:9400/metrics"
    with pytest.raises(config.ConfigError, match="loopback") as e:
        config.parse("dcgm_exporter: http://u:s3cret@10.0.0.2:9400/metrics", config.AgentConfig)
    assert "s3cret" not in str(e.value)
