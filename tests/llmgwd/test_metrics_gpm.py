"""/metrics: GPM's profiling counters of the recorded real cards, as a user reads them: each
H100's SMs, occupancy, tensor cores and DRAM; each MIG instance apart from its card; nothing
for cards without GPM."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from llmgwd.metrics.gpus import GpuCollector
from tests.llmgw_agentd.nvml_inventory import hopper_mig, load, recorded
from tests.llmgw_agentd.test_gpm import H100_0, H100_1
from tests.llmgwd.test_metrics import node, samples

COUNTERS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active")


def test_each_h100_and_each_mig_instance_has_its_counters_and_other_cards_none() -> None:
    nodes = [
        node("dgx", recorded(load("dgx-h100-8x80gb"))),
        node("hopper", recorded(hopper_mig())),
        node("a100", recorded(load("a100-80gb-mig"))),
        node("rtx", recorded(load("rtx4090-8x24gb"))),
    ]
    registry = CollectorRegistry()
    registry.register(GpuCollector(lambda: nodes))
    found = samples(registry)
    for gpu, want in (("0", H100_0), ("1", H100_1)):
        got = [found[(f"llmgw_gpu_{c}_ratio", (("gpu", gpu), ("node", "dgx")))] for c in COUNTERS]
        assert got == pytest.approx(want)
    # Only the two H100s whose counters were recorded have card series: none for the H100s
    # without GPM answers, the A100 (no GPM before Hopper), the GeForce cards, or a card in
    # MIG mode, whose instances carry their own.
    for c in COUNTERS:
        cards = {dict(labels)["gpu"] for name, labels in found if name == f"llmgw_gpu_{c}_ratio"}
        assert cards == {"0", "1"}
    (card,) = nodes[1].inventory.gpus
    for inst, want in zip(card.instances, [H100_0, H100_1] * 2, strict=True):
        labels = {"node": "hopper", "gpu": "0", "instance": inst.uuid, "profile": "1g.20gb"}
        key = tuple(sorted(labels.items()))
        got = [found[(f"llmgw_mig_{c}_ratio", key)] for c in COUNTERS]
        assert got == pytest.approx(want)
    mig_nodes = {dict(labels)["node"] for name, labels in found
                 if name == "llmgw_mig_sm_active_ratio"}  # fmt: skip
    assert mig_nodes == {"hopper"}
    assert len([k for k in found if k[0] == "llmgw_mig_sm_active_ratio"]) == 4
