"""The router's metrics, counted on the hot path: pre-bound label children, one lock each.

Labels are bounded: a model counts under its name only when it is in the catalog (a request
naming anything else counts under model=""), a route is one of /v1's routes, a status is its
class ("2xx", "4xx", "5xx"). No key, no client address, no request id is ever a label."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from llmgwd.router import errors
from llmgwd.router.exchange import Exchange

Known = Callable[[str], bool]  # whether a model name is in the catalog

# Seconds: a request may last from milliseconds (an error, /v1/models) to minutes (a stream).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_REFUSALS = {"rate_limit_exceeded": "rate_limit", "insufficient_quota": "budget"}


def status_class(status: int) -> str:
    """'2xx', '4xx', '5xx' (a client that left: 499, '4xx')."""
    return f"{min(max(status // 100, 1), 5)}xx"


def route_of(request: web.Request) -> str:
    """The route's pattern ('/v1/chat/completions', '/v1/models/{model}'), '' for none."""
    resource = request.match_info.route.resource
    return "" if resource is None else resource.canonical


class RouterMetrics:
    """The /v1 counters and histograms, registered in registry."""

    def __init__(self, registry: CollectorRegistry, known: Known) -> None:
        self._known = known
        self.registry = registry
        self.requests = Counter(
            "llmgw_requests", "Requests answered on /v1, by model, route and status class.",
            ["model", "route", "status_class"], registry=registry,
        )  # fmt: skip
        self.duration = Histogram(
            "llmgw_request_duration_seconds", "Time from a /v1 request's headers to the end of "
            "its answer (a stream's last event).", ["model"], registry=registry,
            buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.first_token = Histogram(
            "llmgw_first_token_seconds", "Time from a streamed request's headers to its first "
            "event from the engine.", ["model"], registry=registry, buckets=FIRST_TOKEN_BUCKETS,
        )  # fmt: skip
        self.tokens = Counter(
            "llmgw_tokens", "Tokens counted on settled requests (the engine's usage, else the "
            "router's bound), by direction: in (prompt) or out (completion).",
            ["model", "direction"], registry=registry,
        )  # fmt: skip
        # Named with its unit, as Prometheus asks: whole units of the site's currency (the one
        # prices and spend budgets are set in; llmgw names none), summed from the meter's picos.
        self.spend = Counter(
            "llmgw_spend_currency_units", "What settled requests cost at the models' prices, "
            "in whole units of the prices' currency.",
            ["model"], registry=registry,
        )  # fmt: skip
        self.refusals = Counter(
            "llmgw_refusals", "Requests refused by a key's rate limit or budget.",
            ["model", "reason"], registry=registry,
        )  # fmt: skip
        self.slot_wait = Histogram(
            "llmgw_slot_wait_seconds", "How long requests waited in line for a free slot.",
            ["model"], registry=registry, buckets=WAIT_BUCKETS,
        )  # fmt: skip
        self.wakeups = Counter(
            "llmgw_wakeups", "Requests that found their on-demand model asleep, by result.",
            ["model", "result"], registry=registry,
        )  # fmt: skip
        self.wake_wait = Histogram(
            "llmgw_wakeup_wait_seconds", "How long a request waited for its model to wake.",
            ["model"], registry=registry, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self._children: dict[tuple[object, ...], Any] = {}

    def _child(self, metric: Counter | Histogram, *labels: str) -> Any:
        """metric's child of those labels, bound once (labels() locks and builds a key)."""
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def model(self, name: str | None) -> str:
        """The model's label: its name when in the catalog, else ''."""
        return name if name and self._known(name) else ""

    def ended(
        self, request: web.Request, status: int, error: errors.ApiError | None, ex: Exchange
    ) -> None:
        """Count a /v1 request whose answer ended (told by the error middleware, which sees
        the ApiError of a refusal as such)."""
        model, started = self.model(ex.model), ex.started
        if error is not None and (reason := _REFUSALS.get(error.detail.code or "")) is not None:
            self._child(self.refusals, model, reason).inc()
        self._child(self.requests, model, route_of(request), status_class(status)).inc()
        self._child(self.duration, model).observe(time.perf_counter() - started)
        tally = ex.tally
        if tally is not None and tally.first_at:
            self._child(self.first_token, model).observe(tally.first_at - started)

    def settled(self, model: str, prompt: int, completion: int, picos: int) -> None:
        """The meter settled a request that the engine answered."""
        label = self.model(model)
        self._child(self.tokens, label, "in").inc(prompt)
        self._child(self.tokens, label, "out").inc(completion)
        self._child(self.spend, label).inc(picos / 1e12)

    def waited(self, model: str, seconds: float) -> None:
        """A request waited seconds in line for a slot (served or not)."""
        self._child(self.slot_wait, self.model(model)).observe(seconds)

    def woke(self, model: str, seconds: float, ready: bool) -> None:
        """A request waited seconds for its asleep model; ready: whether it woke in time."""
        label = self.model(model)
        self._child(self.wakeups, label, "ready" if ready else "timeout").inc()
        self._child(self.wake_wait, label).observe(seconds)
