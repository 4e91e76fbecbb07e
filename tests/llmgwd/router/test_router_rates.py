"""The control plane's own request rates (router.rates): what the router's request counter
(llmgw_requests) grew by over the last minute, per second, with its 4xx and 5xx."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llmgwd.router.metrics import RouterMetrics
from llmgwd.router.rates import Rate, Rates


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def count(metrics: RouterMetrics, status_class: str, n: int, model: str = "smol") -> None:
    for _ in range(n):
        metrics.requests.labels(model, "/v1/chat/completions", status_class).inc()


def test_the_rates_are_the_counters_growth_over_the_last_minute() -> None:
    metrics, clock = RouterMetrics(CollectorRegistry(), lambda m: True), Clock()
    count(metrics, "2xx", 500)  # before the rates were read first: not in any window
    rates = Rates(metrics.requests, clock)
    assert rates.read() == Rate(0.0, 0.0, 0.0, 0.0)  # nothing to compare yet
    for _ in range(12):  # read every 5 s, as the overview polls
        clock.now += 5
        count(metrics, "2xx", 40)
        count(metrics, "4xx", 8, model="")
        count(metrics, "5xx", 2)
        rate = rates.read()
    assert rate == Rate(60.0, 10.0, 1.6, 0.4)
    for _ in range(12):  # a quieter minute: the first one is out of the window
        clock.now += 5
        count(metrics, "2xx", 5)
        rate = rates.read()
    assert rate == Rate(60.0, 1.0, 0.0, 0.0)


def test_a_read_long_after_the_last_covers_the_time_since() -> None:
    metrics, clock = RouterMetrics(CollectorRegistry(), lambda m: True), Clock()
    rates = Rates(metrics.requests, clock)
    clock.now += 300
    count(metrics, "5xx", 30)
    assert rates.read() == Rate(300.0, 0.1, 0.0, 0.1)  # window_s says over how long


def test_reads_within_a_second_give_the_same_figures_without_counting_again() -> None:
    metrics, clock = RouterMetrics(CollectorRegistry(), lambda m: True), Clock()
    rates = Rates(metrics.requests, clock)
    clock.now += 10
    count(metrics, "2xx", 10)
    assert rates.read() == Rate(10.0, 1.0, 0.0, 0.0)
    clock.now += 0.5  # fifty pages polling: one count a second at most
    count(metrics, "2xx", 100)
    assert rates.read() == Rate(10.0, 1.0, 0.0, 0.0)
    clock.now += 0.5
    assert rates.read() == Rate(11.0, 110 / 11, 0.0, 0.0)
