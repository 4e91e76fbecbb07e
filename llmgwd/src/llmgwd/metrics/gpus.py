"""Each node's GPUs as Prometheus series, built at scrape time from the inventories the agents
sent: a card's memory, busy share and power; each MIG instance as series of its own (an
instance's memory only: NVML tells no busy share or power per instance); and where GPM reads
them (Hopper and later), the profiling counters of each card, or of each MIG instance but never
its card. The node list is read on the loop; its inventories are frozen structs, so the series
may be built anywhere."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.wire import Gpu, GpuCounters
from llmgwd.metrics.scrape import Fixed
from llmgwd.nodes.state import NodeInfo

Nodes = Callable[[], Iterable[NodeInfo]]
_CARD = ["node", "gpu"]
_MIG = ["node", "gpu", "instance", "profile"]
# GPM's counters: the series' middle name, GpuCounters' field, what it tells.
_COUNTERS = (
    ("sm_active", "sm_active_percent", "Share of the SMs busy"),
    ("sm_occupancy", "sm_occupancy_percent", "Warps resident on the SMs against their most"),
    ("tensor_active", "tensor_active_percent", "Share of the time any tensor core pipe ran"),
    ("dram_active", "dram_active_percent", "DRAM bandwidth used against its peak"),
)


class _Counters:
    """The four families of GPM's counters, for cards or for MIG instances."""

    def __init__(self, prefix: str, what: str, labels: list[str]) -> None:
        self.families = [
            _gauge(f"{prefix}_{name}_ratio", f"{doc} on {what}, over the agent's last report "
                   "interval (NVML's GPM, Hopper and later).", labels)
            for name, _, doc in _COUNTERS
        ]  # fmt: skip

    def add(self, labels: list[str], counters: GpuCounters | None) -> None:
        if counters is None:
            return
        for family, (_, field, _) in zip(self.families, _COUNTERS, strict=True):
            percent = getattr(counters, field)
            if percent is not None:
                family.add_metric(labels, percent / 100)


class GpuCollector(Collector):
    """The GPUs of every node the control plane knows (as last reported)."""

    def __init__(self, nodes: Nodes) -> None:
        self._nodes = nodes

    def snapshot(self) -> Fixed[list[NodeInfo]]:
        """The nodes as now, their series built wherever they are collected."""
        return Fixed(families, list(self._nodes()))

    def collect(self) -> Iterator[Metric]:
        """The families, filled from each node's inventory."""
        return families(self._nodes())


def families(nodes: Iterable[NodeInfo]) -> Iterator[Metric]:
    """The GPU families of the nodes' inventories."""
    info = InfoMetricFamily("llmgw_gpu", "A card: its model, UUID and MIG mode.",
                            labels=_CARD)  # fmt: skip
    used = _gauge("llmgw_gpu_memory_used_bytes", "A card's memory in use.", _CARD)
    total = _gauge("llmgw_gpu_memory_total_bytes", "A card's memory.", _CARD)
    busy = _gauge("llmgw_gpu_busy_ratio", "Share of the last sample period in which a "
                  "kernel ran on the card (NVML's utilization).", _CARD)  # fmt: skip
    draw = _gauge("llmgw_gpu_power_draw_watts", "A card's power draw.", _CARD)
    limit = _gauge("llmgw_gpu_power_limit_watts", "A card's power limit.", _CARD)
    mig_used = _gauge("llmgw_mig_memory_used_bytes", "A MIG instance's memory in use.", _MIG)
    mig_total = _gauge("llmgw_mig_memory_total_bytes", "A MIG instance's memory.", _MIG)
    card_counters = _Counters("llmgw_gpu", "a card", _CARD)
    mig_counters = _Counters("llmgw_mig", "a MIG instance", _MIG)
    for node in nodes:
        for gpu in node.inventory.gpus:
            card = [node.name, str(gpu.index)]
            info.add_metric(card, {"name": gpu.name, "uuid": gpu.uuid,
                                   "mig": "true" if gpu.mig else "false"})  # fmt: skip
            used.add_metric(card, gpu.memory_total_bytes - gpu.memory_free_bytes)
            total.add_metric(card, gpu.memory_total_bytes)
            _optional(gpu, card, busy, draw, limit)
            card_counters.add(card, gpu.counters)
            for mig in gpu.instances:
                labels = [*card, mig.uuid, mig.profile]
                mig_used.add_metric(labels, mig.memory_total_bytes - mig.memory_free_bytes)
                mig_total.add_metric(labels, mig.memory_total_bytes)
                mig_counters.add(labels, mig.counters)
    yield from (info, used, total, busy, draw, limit, mig_used, mig_total)
    yield from (*card_counters.families, *mig_counters.families)


def _gauge(name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


def _optional(
    gpu: Gpu, card: list[str], busy: GaugeMetricFamily, draw: GaugeMetricFamily,
    limit: GaugeMetricFamily,
) -> None:  # fmt: skip
    """The figures NVML may not tell (a MIG card's busy share, a card without power readings)."""
    if gpu.utilization_percent is not None:
        busy.add_metric(card, gpu.utilization_percent / 100)
    if gpu.power_draw_mw is not None:
        draw.add_metric(card, gpu.power_draw_mw / 1000)
    if gpu.power_limit_mw is not None:
        limit.add_metric(card, gpu.power_limit_mw / 1000)
