"""A scrape that does not hold the event loop: the state copied on the loop, the series built
and formatted in a worker thread, one render at a time (scrapes arriving meanwhile share it)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

S = TypeVar("S")


class Snapshotting(Protocol):
    """A collector of state that only the loop may read."""

    def snapshot(self) -> Collector:
        """On the loop: a collector over a copy of the state, safe to collect in any thread."""
        ...


class Fixed(Collector, Generic[S]):
    """The families of a state copied once, built wherever collect() runs."""

    def __init__(self, families: Callable[[S], Iterable[Metric]], state: S) -> None:
        self._families, self._state = families, state

    def collect(self) -> Iterable[Metric]:
        """The families of the copied state."""
        return self._families(self._state)


class _Joined(Collector):
    def __init__(self, collectors: Sequence[Collector]) -> None:
        self._collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for collector in self._collectors:
            yield from collector.collect()


class Scraper:
    """Renders live (the router's thread-safe counters) and the snapshots of state in a thread."""

    def __init__(self, live: CollectorRegistry, state: Sequence[Snapshotting]) -> None:
        self._live, self._state = live, state
        self._pending: asyncio.Future[bytes] | None = None

    async def render(self) -> bytes:
        """Prometheus' text format of every series (shared with a render already running)."""
        if self._pending is None or self._pending.done():
            joined = _Joined([self._live, *(s.snapshot() for s in self._state)])  # on the loop
            self._pending = asyncio.ensure_future(asyncio.to_thread(generate_latest, joined))
        return await asyncio.shield(self._pending)  # a scraper that leaves cancels no other's
