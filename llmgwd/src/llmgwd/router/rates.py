"""This control plane's own /v1 request rates over the last minute, read from the router's
request counter (metrics.RouterMetrics.requests) as deltas of its totals at each read: nothing
is added to the hot path, where the counter is bumped as before."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

WINDOW_S = 60.0  # the figures' span, when read at least that often
SAMPLE_S = 1.0  # totals kept at most once a second: at most WINDOW_S / SAMPLE_S + 1 of them


@dataclass(frozen=True, slots=True)
class Totals:
    """The counter's totals at one moment: every request, and the 4xx and 5xx answers."""

    at: float
    requests: float
    c4xx: float
    c5xx: float


@dataclass(frozen=True, slots=True)
class Rate:
    """Per second over window_s seconds (0 and zeros: nothing to compare yet)."""

    window_s: float
    requests: float
    c4xx: float
    c5xx: float


class Rates:
    """The requests per second, 4xx and 5xx per second over the last minute, of one counter
    labelled by status_class (as llmgw_requests is)."""

    def __init__(self, counter: Counter, clock: Callable[[], float] = time.monotonic) -> None:
        self._counter = counter
        self._clock = clock
        self._samples: deque[Totals] = deque([self._totals()])
        self._last: Rate | None = None

    def _totals(self) -> Totals:
        requests = c4xx = c5xx = 0.0
        for status_class, value in _values(self._counter):
            requests += value
            c4xx += value if status_class == "4xx" else 0.0
            c5xx += value if status_class == "5xx" else 0.0
        return Totals(self._clock(), requests, c4xx, c5xx)

    def read(self) -> Rate:
        """The rates from the newest totals at least WINDOW_S old (else the oldest) to now."""
        if self._last is not None and self._clock() - self._samples[-1].at < SAMPLE_S:
            return self._last  # read again within the second: the same figures, not counted
        now, samples = self._totals(), self._samples
        while len(samples) > 1 and now.at - samples[1].at >= WINDOW_S:
            samples.popleft()
        base = samples[0]
        if now.at - samples[-1].at >= SAMPLE_S:
            samples.append(now)
        span = now.at - base.at
        if span <= 0:
            return Rate(0.0, 0.0, 0.0, 0.0)
        self._last = Rate(
            window_s=round(span, 3),
            requests=round((now.requests - base.requests) / span, 3),
            c4xx=round((now.c4xx - base.c4xx) / span, 3),
            c5xx=round((now.c5xx - base.c5xx) / span, 3),
        )
        return self._last


def _values(counter: Counter) -> list[tuple[str, float]]:
    """Each child's status_class and value. prometheus_client's own children and values, read
    directly: its collect() builds a sample with a label dict per child, some 6 µs each on
    the loop (18 ms for 3000 children, 0.7 ms so); through collect() where those are not there."""
    at = counter._labelnames.index("status_class")
    try:
        children: Any = counter._metrics
        return [(labels[at], child._value.get()) for labels, child in list(children.items())]
    except AttributeError:
        return [
            (s.labels.get("status_class", ""), s.value)
            for metric in counter.collect()
            for s in metric.samples
            if s.name.endswith("_total")
        ]
