"""/metrics' names as Prometheus' conventions have them: a counter's unit in its name (spend in
units of the prices' currency), and counters that never go down."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

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
