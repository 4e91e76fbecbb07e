"""Replicas that keep failing, taken out of the pool for a pause that doubles up to a cap."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("llmgwd.router")

Clock = Callable[[], float]

FAILURES = 3  # consecutive failures that take a replica out
PAUSE_S = 10.0  # its first pause; doubled each time it fails again on its return
MAX_PAUSE_S = 160.0


@dataclass(slots=True)
class _Record:
    failures: int = 0  # consecutive, since its last success or its return
    pause_s: float = 0.0  # its last pause; 0: not taken out since its last success
    until: float = 0.0  # on the clock: out until then


class Ejections:
    """Per replica id: consecutive failures, and whether the replica is out of the pool now.

    A replica is out for PAUSE_S after FAILURES failures in a row. When it is back, its next
    request is a trial: one more failure takes it out again for twice as long (to a cap), one
    success forgets it all. Failures of requests that were in flight while it was out add
    nothing: they were sent before it was taken out.
    """

    def __init__(
        self,
        *,
        failures: int = FAILURES,
        pause_s: float = PAUSE_S,
        max_pause_s: float = MAX_PAUSE_S,
        clock: Clock = time.monotonic,
    ) -> None:
        self._failures = failures
        self._pause_s = pause_s
        self._max_pause_s = max_pause_s
        self._clock = clock
        self._records: dict[str, _Record] = {}

    def out(self, replica_id: str) -> bool:
        """Whether replica_id is out of the pool now."""
        record = self._records.get(replica_id)
        return record is not None and self._clock() < record.until

    def failed(self, replica_id: str) -> None:
        """A request to replica_id failed before it answered (refused, 503, broken)."""
        if self.out(replica_id):
            return
        record = self._records.setdefault(replica_id, _Record())
        record.failures += 1
        on_trial = record.pause_s > 0
        if on_trial or record.failures >= self._failures:
            self._take_out(replica_id, record)

    def succeeded(self, replica_id: str) -> None:
        """replica_id answered: its failures are forgotten."""
        self._records.pop(replica_id, None)

    def _take_out(self, replica_id: str, record: _Record) -> None:
        pause = min(self._max_pause_s, record.pause_s * 2 or self._pause_s)
        record.pause_s, record.until, record.failures = pause, self._clock() + pause, 0
        log.warning("replica %s keeps failing: out of the pool for %gs", replica_id, pause)
