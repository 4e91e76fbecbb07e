"""The cluster's state as Prometheus series, read at scrape time: nodes by state, replicas
wanted, ready and by state per model, engines' restarts and the scheduler's passes (counters
that never go down: metrics/monotonic.py), read on the loop, built anywhere."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgwd.metrics.monotonic import Rises
from llmgwd.metrics.scrape import Fixed
from llmgwd.nodes.pool import Pool
from llmgwd.nodes.state import NodeInfo

Names = Callable[[], Iterable[str]]  # the catalog's model names
Nodes = Callable[[], Iterable[NodeInfo]]
Queued = Callable[[str], int]  # requests for a model waiting for a slot
Passes = Callable[[], tuple[int, float] | None]  # the scheduler's passes and their seconds
NODE_STATES = ("connected", "disconnected", "lost")
REPLICA_STATES = ("starting", "ready", "failed", "stopped", "stopping")
NodeReplica = tuple[str, str]  # model, state


@dataclass(frozen=True)
class State:
    """What the series are built from, copied on the loop (nodes' fields are frozen structs)."""

    models: Sequence[tuple[str, int, int, int]]  # name, replicas wanted, ready, waiting
    nodes: Sequence[tuple[str, Sequence[NodeReplica]]]  # a node's state, its replicas
    passes: tuple[float, float]  # the scheduler's passes run here and their seconds, all terms
    restarts: Sequence[tuple[str, float]] = ()  # model, its engines' restarts seen by llmgwd


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
        self._restarts = Rises()  # by model, from each replica's count (node/replica)
        self._heard = Rises()  # the nodes read before: a node new to llmgwd is a baseline
        self._pass_totals = Rises()  # "passes" and "seconds", from this term's reconciler

    def read(self) -> State:
        """The state now, from the catalog, the pool and the nodes (on the loop)."""
        models = [(m, self._pool.wanted(m), len(self._pool.ready(m)), self._queued(m))
                  for m in self._models()]  # fmt: skip
        infos = list(self._nodes())
        self._count_restarts(infos)
        nodes = [(_state(n, self._grace_s), tuple((r.model, r.state) for r in n.replicas))
                 for n in infos]  # fmt: skip
        restarts = tuple(sorted(self._restarts.totals.items()))
        return State(models, nodes, self._count_passes(), restarts)

    def _count_restarts(self, infos: Sequence[NodeInfo]) -> None:
        """Add each replica's restarts since the last read. A node llmgwd had not heard from
        (its own start, a new term's first reports) sets the baseline: what its replicas
        restarted before is not counted, so the counter starts at 0 with the process."""
        for n in infos:
            first = not self._heard.known(n.name)
            self._heard.see("", n.name, 0)
            for r in n.replicas:
                self._restarts.see(r.model, f"{n.name}/{r.id}", r.restarts, baseline=first)
        self._restarts.forget_unseen()
        self._heard.forget_unseen()

    def _count_passes(self) -> tuple[float, float]:
        """The scheduler's passes and seconds over every term led here (a term's reconciler
        counts from 0; none between terms)."""
        passes, seconds = self._passes() or (0, 0.0)
        self._pass_totals.see("passes", "reconciler", passes)
        self._pass_totals.see("seconds", "reconciler seconds", seconds)
        return self._pass_totals.totals["passes"], self._pass_totals.totals["seconds"]

    def snapshot(self) -> Fixed[State]:
        """The state read now, its series built wherever they are collected."""
        return Fixed(families, self.read())

    def collect(self) -> Iterator[Metric]:
        """The families, read from the catalog, the pool and the nodes."""
        yield from families(self.read())


def families(state: State) -> Iterator[Metric]:
    """The cluster's families of state."""
    yield from _by_model(state)
    yield from _by_node(state)
    yield from _scheduler(state)


def _scheduler(state: State) -> Iterator[Metric]:
    """The scheduler's passes on this control plane, over every term it led (none on a
    standby that never led)."""
    passes, seconds = state.passes
    yield CounterMetricFamily("llmgw_scheduler_passes", "Scheduler passes run here.",
                              value=passes)  # fmt: skip
    yield CounterMetricFamily("llmgw_scheduler_pass_seconds", "Seconds the scheduler's "
                              "passes took here, all together.", value=seconds)  # fmt: skip


def _by_model(state: State) -> Iterator[Metric]:
    labels = ["model"]
    wanted = GaugeMetricFamily("llmgw_replicas_wanted", "Replicas the scheduler places.",
                               labels=labels)  # fmt: skip
    ready = GaugeMetricFamily("llmgw_replicas_ready", "Replicas ready to serve.",
                              labels=labels)  # fmt: skip
    queued = GaugeMetricFamily("llmgw_requests_waiting", "Requests waiting for a free "
                               "slot on this control plane.", labels=labels)  # fmt: skip
    for name, n_wanted, n_ready, n_queued in state.models:
        wanted.add_metric([name], n_wanted)
        ready.add_metric([name], n_ready)
        queued.add_metric([name], n_queued)
    yield from (wanted, ready, queued)


def _by_node(state: State) -> Iterator[Metric]:
    nodes: Counter[str] = Counter()
    states: Counter[tuple[str, str]] = Counter()
    for node_state, replicas in state.nodes:
        nodes[node_state] += 1
        for model, replica_state in replicas:
            states[(model, replica_state)] += 1
    family = GaugeMetricFamily("llmgw_nodes", "Nodes by state.", labels=["state"])
    for node_state in NODE_STATES:
        family.add_metric([node_state], nodes[node_state])
    yield family
    family = GaugeMetricFamily("llmgw_replicas", "Replicas the agents report, by state.",
                               labels=["model", "state"])  # fmt: skip
    for (model, replica_state), n in sorted(states.items()):
        family.add_metric([model, replica_state], n)
    yield family
    counter = CounterMetricFamily(
        "llmgw_engine_restarts",
        "Engine restarts the agents reported while this llmgwd ran (replaced replicas' too).",
        labels=["model"],
    )
    for model, total in state.restarts:
        counter.add_metric([model], total)
    yield counter


def _state(node: NodeInfo, grace_s: float) -> str:
    if node.connected:
        return "connected"
    return "disconnected" if node.silent_s < grace_s else "lost"
