"""/metrics' names as Prometheus' conventions have them: a counter's or a budget's unit in its
name (spend in units of the prices' currency), and counters that never go down."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from llmgw.wire import Inventory, ReplicaStatus
from llmgwd.metrics import budgets
from llmgwd.metrics.cluster import ClusterCollector
from llmgwd.nodes.pool import Endpoint
from llmgwd.nodes.state import NodeInfo
from llmgwd.router.metrics import RouterMetrics


def exposition(registry: CollectorRegistry) -> dict[str, float]:
    """name{labels} -> value, as Prometheus reads the registry."""
    text = generate_latest(registry).decode()
    return {
        f"{s.name}{dict(sorted(s.labels.items()))}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_spend_is_a_counter_named_with_its_unit() -> None:
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry, known=lambda name: name == "smol")
    metrics.settled("smol", prompt=1000, completion=10, picos=2_500_000_000_000)
    metrics.settled("smol", prompt=1000, completion=10, picos=500_000_000_000)
    found = exposition(registry)
    assert found["llmgw_spend_currency_units_total{'model': 'smol'}"] == 3.0
    assert not [name for name in found if name.startswith("llmgw_spend_total")]
    text = generate_latest(registry).decode()
    assert "# TYPE llmgw_spend_currency_units_total counter" in text


class Pool:
    def ready(self, model: str) -> list[Endpoint]:
        return []

    def wanted(self, model: str) -> int:
        return 1


def node(*replicas: ReplicaStatus) -> NodeInfo:
    inventory = Inventory(cores=2, memory_bytes=1 << 30, memory_free_bytes=1 << 29)
    return NodeInfo(name="a", address="10.0.0.1", version="1", inventory=inventory,
                    replicas=replicas, desired=None, connected=True, last_seen=0.0)  # fmt: skip


def test_engine_restarts_and_scheduler_passes_never_go_down() -> None:
    nodes: list[NodeInfo] = []
    passes: list[tuple[int, float] | None] = [None]
    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: ["m"], Pool(), lambda: nodes, lambda m: 0, 60.0,
                                       lambda: passes[0]))  # fmt: skip

    def read(*replicas: ReplicaStatus, reconciler: tuple[int, float] | None = None) -> float:
        """The restarts counted once node a reports replicas (none: it is not listed)."""
        nodes[:] = [node(*replicas)] if replicas else []
        passes[0] = reconciler
        return exposition(registry).get("llmgw_engine_restarts_total{'model': 'm'}", 0.0)

    r = ReplicaStatus
    assert read(r("r1", "m", "ready", restarts=5)) == 0  # restarted before llmgwd heard of it
    assert read(r("r1", "m", "ready", restarts=8)) == 3
    # r1 replaced by r2, which has restarted less: the counter does not go down
    assert read(r("r2", "m", "starting")) == 3
    assert read(r("r2", "m", "ready", restarts=1)) == 4
    assert read() == 4  # the node gone silent and out of the list
    assert read(r("r2", "m", "ready", restarts=1)) == 4  # back: nothing counted twice
    # a replica new on a node llmgwd knows: every restart of it happened while llmgwd watched
    assert read(r("r2", "m", "ready", restarts=1), r("r3", "m", "ready", restarts=2)) == 6
    # the scheduler's passes over terms: a new term's reconciler counts from 0 again
    for reconciler, total in (((5, 0.5), 5), (None, 5), ((2, 0.25), 7), ((4, 0.5), 9)):
        read(r("r2", "m", "ready", restarts=1), reconciler=reconciler)
        assert exposition(registry)["llmgw_scheduler_passes_total{}"] == total


def test_a_budgets_unit_is_in_its_series_name_not_in_a_label() -> None:
    acme = [
        budgets.Budget("org", "acme", "tokens", "month", 1000.0, 950.0),
        budgets.Budget("org", "acme", "spend", "month", 20.0, 4.5),
    ]
    registry = CollectorRegistry()
    registry.register(Collected(list(budgets.families(tuple(acme)))))
    labels = "{'level': 'org', 'name': 'acme', 'period': 'month'}"
    assert exposition(registry) == {
        f"llmgw_budget_tokens_limit{labels}": 1000.0,
        f"llmgw_budget_tokens_used{labels}": 950.0,
        f"llmgw_budget_spend_currency_units_limit{labels}": 20.0,
        f"llmgw_budget_spend_currency_units_used{labels}": 4.5,
    }


class Collected(Collector):
    """Fixed families, as a collector."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families
