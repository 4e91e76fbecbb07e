"""Counters that never go down for the life of llmgwd, summed from counts that start again:
a replica's restarts (a replaced replica's are gone from its agent's report), the scheduler's
passes (a new term's reconciler counts from 0). Each source's rise since it was last read is
added to its key's total; a count lower than the last one read is a source that started
again, all of it a rise."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

FORGET_S = 86_400.0  # a source unseen this long is forgotten (seen again: counted anew)


class Rises:
    """Per-key totals of the rises of many sources (a source: one replica, one reconciler)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[str, tuple[float, float]] = {}  # source: its count, when last read
        self.totals: defaultdict[str, float] = defaultdict(float)

    def known(self, source: str) -> bool:
        """Whether source was read before (and not forgotten)."""
        return source in self._last

    def see(self, key: str, source: str, count: float, *, baseline: bool = False) -> None:
        """source counts count now. baseline: a source first seen counted before llmgwd
        could watch it (a node's replicas when the node is first heard from): only its rises
        from now on are added."""
        last = self._last.get(source)
        if last is None:
            rise = 0.0 if baseline else count
        else:
            rise = count - last[0] if count >= last[0] else count
        self.totals[key] += rise
        self._last[source] = (count, self._clock())

    def forget_unseen(self) -> None:
        """Drop sources unseen for FORGET_S, so that memory follows the sources alive."""
        now = self._clock()
        for source in [s for s, (_, at) in self._last.items() if now - at > FORGET_S]:
            del self._last[source]
