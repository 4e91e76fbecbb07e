"""Leader election: one key, /leader, created by a transaction with the candidate's lease.

Every control plane tries `txn(/leader does not exist) -> put /leader with my lease`; the one
whose put lands leads, and its term is the key's create revision (a new term is a new
create, so no two terms share one). The others watch the key and try again when it is
deleted (its lease revoked or run out). One key rather than a key per candidate with the
lowest create revision winning (etcd's own election recipe): with 3 or 5 candidates the
herd that wakes on a delete is 2 or 4 transactions, and one key is what standbys and
`llmgw planes` read to know who leads. Never etcd's lock API: the fence (fence.py) needs
the term's revision, and a lock service's session would be a second lease to keep.

The leader trusts its lease on its own clock (session.py): when the lease was not renewed
in time it steps down before the store's TTL can run out, so two leaders never both
believe they lead; a paused leader that missed that is stopped by the fence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec

from llmgwd.planes.session import Session
from llmgwd.store import Compare, Delete, Get, Put, Store

log = logging.getLogger(__name__)

LEADER = "/leader"
RETRY_S = 0.5  # after a store failure while campaigning

Lead = Callable[[int], Coroutine[Any, Any, None]]


class LeaderRecord(msgspec.Struct, frozen=True):
    """The value of /leader: who leads, and where agents reach it."""

    name: str
    url: str  # its cluster port's URL


_dec = msgspec.json.Decoder(LeaderRecord)


class Election:
    """Campaigns for leadership for ever; while leading, runs lead(term) and cancels it when
    the term ends (lease not renewed in time, the key gone, a write fenced off, stop)."""

    def __init__(
        self,
        store: Store,
        session: Session,
        me: LeaderRecord,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._session = session
        self.me = me
        self._clock = clock
        self.term = 0  # the term this process leads (0: it does not)
        self.leader: LeaderRecord | None = None  # who leads, as last seen (None: nobody)
        self._deposed = asyncio.Event()
        self._watchers: list[Callable[[], None]] = []

    @property
    def leading(self) -> bool:
        """Whether this process leads now."""
        return self.term != 0

    def on_change(self, hook: Callable[[], None]) -> None:
        """Call hook whenever this process's role or the known leader changes."""
        self._watchers.append(hook)

    def step_down(self, why: str) -> None:
        """End this term now (the fence refused a write, or the lease is not trusted)."""
        if self.term and not self._deposed.is_set():
            log.warning("stepping down as leader (term %d): %s", self.term, why)
            self._deposed.set()

    async def run(self, lead: Lead) -> None:
        """Campaign, lead or follow, and campaign again, until cancelled."""
        while True:
            if not self._session.trusted():
                await self._session.wait_changed()
                continue
            try:
                term, revision = await self._campaign(self._session.lease)
            except Exception as e:
                log.warning("campaign for leadership failed (%s); trying again", _why(e))
                await asyncio.sleep(RETRY_S)
                continue
            if term:
                await self._hold(term, revision, lead)
            else:
                await self._follow(revision)

    async def _campaign(self, lease: int) -> tuple[int, int]:
        """Put /leader if nobody holds it: (my term or 0, the revision read at)."""
        value = msgspec.json.encode(self.me)
        res = await self._store.txn(
            [Compare(LEADER, "version", "=", 0)],
            [Put(LEADER, value, lease=lease), Get(LEADER)],
            [Get(LEADER)],
        )
        kvs = res.responses[-1]
        holder = _dec.decode(kvs[0].value) if kvs else None
        self._seen(holder)
        if not res.succeeded and kvs and holder is not None and holder.name == self.me.name:
            await self._end_old_self(kvs[0].lease, lease)
        return (kvs[0].create_revision if res.succeeded and kvs else 0), res.revision

    async def _end_old_self(self, held: int, mine: int) -> None:
        """/leader held under this control plane's own name with another lease: what this
        llmgwd held before it was killed and started again. Its lease is revoked, so the
        restart leads at once rather than after the old lease's TTL (names are unique
        among control planes, and systemd runs one llmgwd a host)."""
        if held and held != mine:
            log.info("the leader key is this control plane's from before a restart; ending it")
            with contextlib.suppress(KeyError):
                await self._store.lease_revoke(held)

    async def _follow(self, revision: int) -> None:
        """Until /leader is deleted (or this process's lease changes: campaign with the new)."""
        watch = asyncio.create_task(self._until_deleted(revision))
        changed = asyncio.create_task(self._session.wait_changed())
        try:
            await asyncio.wait([watch, changed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (watch, changed):
                t.cancel()
            await asyncio.gather(watch, changed, return_exceptions=True)
        if watch.done() and not watch.cancelled() and watch.exception() is not None:
            log.warning("watching the leader failed (%s)", _why(watch.exception()))
            await asyncio.sleep(RETRY_S)

    async def _until_deleted(self, revision: int) -> None:
        async for ev in self._store.watch(LEADER, start_revision=revision + 1):
            if ev.type == "delete":
                self._seen(None)
                return
            self._seen(_dec.decode(ev.kv.value))

    async def _hold(self, term: int, revision: int, lead: Lead) -> None:
        """Lead for one term: run lead(term) until deposed, then let the key go."""
        self.term = term
        self._deposed.clear()
        log.info("this control plane leads now (term %d)", term)
        self._seen(self.me, notify=True)
        work: list[asyncio.Task[None]] = [
            asyncio.create_task(lead(term)),
            asyncio.create_task(self._watch_term(term, revision)),
            asyncio.create_task(self._guard(self._session.lease)),
        ]
        deposed: asyncio.Task[bool] = asyncio.create_task(self._deposed.wait())
        try:
            await asyncio.wait([deposed, *work], return_when=asyncio.FIRST_COMPLETED)
            for w in work:
                if w.done() and not w.cancelled() and w.exception() is not None:
                    log.error("leader's work ended", exc_info=w.exception())
        finally:
            self.term = 0
            deposed.cancel()
            for w in work:
                w.cancel()
            await asyncio.gather(deposed, *work, return_exceptions=True)
            log.info("this control plane no longer leads (term %d ended)", term)
            self._seen(None, notify=True)
            await self._release(term)

    async def _watch_term(self, term: int, revision: int) -> None:
        """Ends when /leader is deleted or is another term's."""
        async for ev in self._store.watch(LEADER, start_revision=revision + 1):
            if ev.type == "delete" or ev.kv.create_revision != term:
                self.step_down("the leader key is gone (its lease ran out or was revoked)")
                return

    async def _guard(self, lease: int) -> None:
        """Step down once the lease is not trusted any more, on this process's own clock."""
        while True:
            left = self._session.deadline - self._clock()
            if self._session.lease != lease or left <= 0:
                self.step_down("its store lease was not renewed in time")
                return
            await asyncio.sleep(left)

    async def _release(self, term: int) -> None:
        """Delete /leader if it is still this term's, so another takes over at once."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                self._store.txn([Compare(LEADER, "create", "=", term)], [Delete(LEADER)]),
                self._session.ttl_s,
            )

    def _seen(self, leader: LeaderRecord | None, *, notify: bool = False) -> None:
        if leader == self.leader and not notify:
            return
        self.leader = leader
        for hook in self._watchers:
            try:
                hook()
            except Exception:
                log.exception("a leadership hook failed")


def _why(e: BaseException | None) -> str:
    return (str(e) or type(e).__name__) if e is not None else "?"
