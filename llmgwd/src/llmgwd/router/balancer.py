"""Choosing a replica: least outstanding requests among the pool's ready endpoints."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager

from llmgwd.pool import Endpoint, Pool


class Balancer:
    """Counts the requests in flight per replica and sends each new one to the least busy."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._in_flight: dict[str, int] = {}
        self._turn = 0  # rotates among equally busy replicas

    def outstanding(self, replica_id: str) -> int:
        """Requests in flight on this replica now."""
        return self._in_flight.get(replica_id, 0)

    def pick(self, model: str, exclude: Collection[str] = ()) -> Endpoint | None:
        """The least busy ready replica of model not in exclude (replica ids), or None."""
        ready = [ep for ep in self._pool.ready(model) if ep.replica_id not in exclude]
        if not ready:
            return None
        least = min(self.outstanding(ep.replica_id) for ep in ready)
        ties = [ep for ep in ready if self.outstanding(ep.replica_id) == least]
        self._turn += 1
        return ties[self._turn % len(ties)]

    @contextmanager
    def hold(self, endpoint: Endpoint) -> Iterator[None]:
        """Count one request in flight on endpoint for the duration of the block."""
        rid = endpoint.replica_id
        self._in_flight[rid] = self._in_flight.get(rid, 0) + 1
        try:
            yield
        finally:
            left = self._in_flight[rid] - 1
            if left:
                self._in_flight[rid] = left
            else:  # a replica that went away leaves no entry behind
                del self._in_flight[rid]
