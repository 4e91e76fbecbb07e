"""Choosing a replica: among those whose context holds the request, the highest-priority profile
with room first, then the replica holding the prompt's prefix unless it is much busier, then
least outstanding."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager

from llmgwd.nodes.pool import Endpoint, Pool
from llmgwd.router.ejection import Ejections
from llmgwd.router.prefix import Affinity, PrefixIndex
from llmgwd.router.waitlist import QUEUE_SIZE, QUEUE_TIMEOUT_S, Busy, Waiter, Waitlist

# The cap of a replica whose engine did not say how many requests it serves at once (its
# slots, 0): llama-server's own default (-np unset: 4 slots), so such an engine is neither
# left idle nor made to queue requests inside it, where no other replica could take them.
SLOTS = 4
RECHECK_S = 1.0  # a waiting request looks again this often: a replica may have become ready


class Balancer:
    """Counts the requests in flight per replica and sends each new one to the least busy
    replica of the highest-priority profile that has one with a free slot (all of them busy:
    the least busy of all). With prefix_aware, a request with an affinity goes to the replica
    its session is pinned to, else to the one sent the longest prefix of its prompt, unless
    that one has LOAD_SLACK more requests in flight than the least busy (router/prefix.py).
    acquire never goes past a replica's cap: while every one is full, requests wait in their
    model's line (and take the first free slot, wherever it is)."""

    def __init__(
        self,
        pool: Pool,
        slots: int = SLOTS,
        *,
        queue_size: int = QUEUE_SIZE,
        queue_timeout_s: float = QUEUE_TIMEOUT_S,
        recheck_s: float = RECHECK_S,
        ejections: Ejections | None = None,
        prefix_aware: bool = True,
    ) -> None:
        self._pool = pool
        self._slots = slots  # the cap of replicas that report no slots
        self._waitlist = Waitlist(queue_size)
        self._queue_timeout_s = queue_timeout_s
        self._recheck_s = recheck_s
        self.ejections = ejections if ejections is not None else Ejections()
        self.on_waited: Callable[[str, float], None] | None = None  # (model, seconds in line)
        self._in_flight: dict[str, int] = {}
        self._turn = 0  # rotates among equally busy replicas
        self.prefix = PrefixIndex() if prefix_aware else None

    def outstanding(self, replica_id: str) -> int:
        """Requests in flight on this replica now."""
        return self._in_flight.get(replica_id, 0)

    def pick(
        self, model: str, exclude: Collection[str] = (), affinity: Affinity | None = None
    ) -> Endpoint | None:
        """The least busy ready replica of model not in exclude (replica ids), or None."""
        return self._pick(self._pool.ready(model), exclude, affinity)

    def _pick(
        self, ready: list[Endpoint], exclude: Collection[str], affinity: Affinity | None
    ) -> Endpoint | None:
        if exclude:
            ready = [ep for ep in ready if ep.replica_id not in exclude]
        if not ready:
            return None
        free = [ep for ep in ready if self.room(ep)]
        if free:
            top = max(ep.priority for ep in free)
            ready = [ep for ep in free if ep.priority == top]
        least = min(self.outstanding(ep.replica_id) for ep in ready)
        if affinity is not None and self.prefix is not None:
            chosen = self.prefix.choose(affinity, ready, self.outstanding, least)
            if chosen is not None:
                return chosen
        ties = [ep for ep in ready if self.outstanding(ep.replica_id) == least]
        self._turn += 1
        return ties[self._turn % len(ties)]

    @contextmanager
    def hold(self, endpoint: Endpoint) -> Iterator[None]:
        """Count one request in flight on endpoint for the duration of the block."""
        self._take(endpoint)
        try:
            yield
        finally:
            self.release(endpoint)

    # Slots as caps, and the line of requests waiting for one.

    def cap(self, endpoint: Endpoint) -> int:
        """The most requests endpoint is sent at once: its slots, when its engine said."""
        return endpoint.slots if endpoint.slots > 0 else self._slots

    def room(self, endpoint: Endpoint) -> bool:
        """Whether endpoint has a free slot now."""
        return self.outstanding(endpoint.replica_id) < self.cap(endpoint)

    def queued(self, model: str) -> int:
        """Requests for model waiting for a free slot now."""
        return self._waitlist.count(model)

    async def acquire(
        self,
        model: str,
        exclude: Collection[str] = (),
        affinity: Affinity | None = None,
        ready: list[Endpoint] | None = None,
        need: int = 0,
    ) -> Endpoint | None:
        """A replica of model with a free slot, that slot already counted (give it back with
        release); waits in line, first come first served, while every replica is full.
        ready: the pool's ready replicas of model just read by the caller (else read here);
        need: the least context a replica must run with to be chosen (a replica whose context
        is not known is not held back; 0: any, token_bounds.need).

        None when no replica outside exclude is ready and in the pool (there is none, or all
        are out for failing); raises waitlist.Busy when the line is full or the wait too long.
        """
        if not self._waitlist.count(model):  # nobody waits before this one
            endpoint = self._choose(model, exclude, affinity, ready, need)
            if endpoint is not None:
                self._take(endpoint)
                self._remember(endpoint, affinity)
                return endpoint
        if not self._usable(model, exclude, need):
            return None
        waiter = self._waitlist.join(model, frozenset(exclude), need)
        served, joined = False, time.perf_counter()
        try:
            endpoint = await self._served(model, waiter)
            served = endpoint is not None
            if endpoint is not None:
                self._remember(endpoint, affinity)
            return endpoint
        finally:
            if not served:  # the timeout, none left to wait for, or the client left
                self._give_up(model, waiter)
            if self.on_waited is not None:
                self.on_waited(model, time.perf_counter() - joined)

    def release(self, endpoint: Endpoint) -> None:
        """One request on endpoint ended: its slot goes to the first waiter that may use it."""
        rid = endpoint.replica_id
        left = self._in_flight[rid] - 1
        if left:
            self._in_flight[rid] = left
        else:  # a replica that went away leaves no entry behind
            del self._in_flight[rid]
        self._dispatch(endpoint.model)

    def _take(self, endpoint: Endpoint) -> None:
        rid = endpoint.replica_id
        self._in_flight[rid] = self._in_flight.get(rid, 0) + 1

    def _usable(self, model: str, exclude: Collection[str], need: int = 0) -> list[Endpoint]:
        """Ready replicas of model not in exclude, not out of the pool and not too short."""
        return [
            ep
            for ep in self._pool.ready(model)
            if ep.replica_id not in exclude
            and not self.ejections.out(ep.replica_id)
            and not 0 < ep.context < need
        ]

    def _remember(self, endpoint: Endpoint, affinity: Affinity | None) -> None:
        if affinity is not None and self.prefix is not None:
            self.prefix.remember(endpoint, affinity)

    def _choose(
        self,
        model: str,
        exclude: Collection[str],
        affinity: Affinity | None = None,
        ready: list[Endpoint] | None = None,
        need: int = 0,
    ) -> Endpoint | None:
        """pick's choice among the usable replicas (need: as acquire's) that have a free slot;
        None: all full."""
        if ready is None:
            ready = self._pool.ready(model)
        if self.prefix is not None:
            self.prefix.forget_gone(model, ready)
        closed = {
            ep.replica_id
            for ep in ready
            if ep.replica_id in exclude
            or self.ejections.out(ep.replica_id)
            or not self.room(ep)
            or 0 < ep.context < need
        }
        return self._pick(ready, closed, affinity)

    async def _served(self, model: str, waiter: Waiter) -> Endpoint | None:
        """The replica _dispatch kept a slot on for waiter; None when none is left to wait for."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._queue_timeout_s
        self._dispatch(model)  # a slot those before it cannot use (they tried it) may be free
        while not waiter.future.done():
            left = deadline - loop.time()
            if left <= 0:
                raise Busy(model, "timeout")
            await asyncio.wait({waiter.future}, timeout=min(left, self._recheck_s))
            if waiter.future.done():
                break
            if not self._usable(model, waiter.exclude, waiter.need):
                return None  # its replicas went away (or all failed) while it waited
            self._dispatch(model)  # one may have become ready meanwhile
        return waiter.future.result()

    def _give_up(self, model: str, waiter: Waiter) -> None:
        """waiter leaves the line; a slot kept for it just now goes to the next one."""
        self._waitlist.leave(model, waiter)
        future = waiter.future
        if future.done() and not future.cancelled():
            self.release(future.result())
        future.cancel()

    def _dispatch(self, model: str) -> None:
        """Give free slots to model's waiters, first come first: each gets a replica it has not
        tried, its slot counted at once so that no request arriving later takes it first."""
        for waiter in self._waitlist.waiting(model):
            endpoint = self._choose(model, waiter.exclude, need=waiter.need)
            if endpoint is None:
                if not waiter.exclude and not waiter.need:
                    return  # no free slot at all: none of the later ones can have one either
                continue
            self._waitlist.leave(model, waiter)
            self._take(endpoint)
            waiter.future.set_result(endpoint)
