"""The cluster's state as Prometheus series, built at scrape time: nodes by state, replicas
wanted, ready and by state per model, engines' restarts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgwd.cluster import NodeInfo
from llmgwd.pool import Pool

Names = Callable[[], Iterable[str]]  # the catalog's model names
Nodes = Callable[[], Iterable[NodeInfo]]
Queued = Callable[[str], int]  # requests for a model waiting for a slot
Passes = Callable[[], tuple[int, float] | None]  # the scheduler's passes and their seconds
NODE_STATES = ("connected", "disconnected", "lost")
REPLICA_STATES = ("starting", "ready", "failed", "stopped")


class ClusterCollector(Collector):
    """What this control plane knows of the cluster now (on a standby: the leader's replicas
    as published; nodes and replica states only where agents are connected, the leader)."""

    def __init__(
        self,
        models: Names,
        pool: Pool,
        nodes: Nodes,
        queued: Queued,
        grace_s: float,
        passes: Passes = lambda: None,
    ) -> None:
        self._models, self._pool, self._nodes = models, pool, nodes
        self._queued, self._grace_s, self._passes = queued, grace_s, passes

    def collect(self) -> Iterator[Metric]:
        """The families, read from the catalog, the pool and the nodes."""
        yield from self._by_model()
        yield from self._by_node()
        yield from self._scheduler()

    def _scheduler(self) -> Iterator[Metric]:
        """The scheduler's passes on this control plane (none on a standby)."""
        passes, seconds = self._passes() or (0, 0.0)
        yield CounterMetricFamily("llmgw_scheduler_passes", "Scheduler passes run here.",
                                  value=passes)  # fmt: skip
        yield CounterMetricFamily("llmgw_scheduler_pass_seconds", "Seconds the scheduler's "
                                  "passes took here, all together.", value=seconds)  # fmt: skip

    def _by_model(self) -> Iterator[Metric]:
        labels = ["model"]
        wanted = GaugeMetricFamily("llmgw_replicas_wanted", "Replicas the scheduler places.",
                                   labels=labels)  # fmt: skip
        ready = GaugeMetricFamily("llmgw_replicas_ready", "Replicas ready to serve.",
                                  labels=labels)  # fmt: skip
        queued = GaugeMetricFamily("llmgw_requests_waiting", "Requests waiting for a free "
                                   "slot on this control plane.", labels=labels)  # fmt: skip
        for name in self._models():
            wanted.add_metric([name], self._pool.wanted(name))
            ready.add_metric([name], len(self._pool.ready(name)))
            queued.add_metric([name], self._queued(name))
        yield from (wanted, ready, queued)

    def _by_node(self) -> Iterator[Metric]:
        nodes: Counter[str] = Counter()
        states: Counter[tuple[str, str]] = Counter()
        restarts: Counter[str] = Counter()
        for node in self._nodes():
            nodes[_state(node, self._grace_s)] += 1
            for r in node.replicas:
                states[(r.model, r.state)] += 1
                restarts[r.model] += r.restarts
        family = GaugeMetricFamily("llmgw_nodes", "Nodes by state.", labels=["state"])
        for state in NODE_STATES:
            family.add_metric([state], nodes[state])
        yield family
        family = GaugeMetricFamily("llmgw_replicas", "Replicas the agents report, by state.",
                                   labels=["model", "state"])  # fmt: skip
        for (model, state), n in sorted(states.items()):
            family.add_metric([model, state], n)
        yield family
        counter = CounterMetricFamily(
            "llmgw_engine_restarts",
            "Engine restarts the agents report (since each replica started).",
            labels=["model"],
        )
        for model, n in sorted(restarts.items()):
            counter.add_metric([model], n)
        yield counter


def _state(node: NodeInfo, grace_s: float) -> str:
    if node.connected:
        return "connected"
    return "disconnected" if node.silent_s < grace_s else "lost"
