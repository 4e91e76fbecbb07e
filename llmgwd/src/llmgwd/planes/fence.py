"""The leader's writes, fenced: each one holds only while /leader is still this term's key."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from llmgwd.planes.leader import LEADER
from llmgwd.store import KV, Compare, Delete, Event, Get, Put, Store, TxnResult

log = logging.getLogger(__name__)


class Fenced(Exception):
    """A leader's write refused: this process's term is over (another leads, or none)."""


class FencedStore:
    """A Store for the leader's own keys (the reconciler's, the published replicas): reads go
    to the store as they are; every write is a transaction comparing /leader's create
    revision with the term's, so a leader that was paused or cut off and comes back changes
    nothing. The first refusal is logged and calls on_refused (the election steps down);
    later writes are refused without asking the store."""

    def __init__(self, store: Store, term: int, on_refused: Callable[[str], None]) -> None:
        self._store = store
        self.term = term
        self._on_refused = on_refused
        self.refused = False

    def _fence(self) -> Compare:
        return Compare(LEADER, "create", "=", self.term)

    def _refuse(self, what: str) -> Fenced:
        why = f"a write of the leader's term {self.term} was refused ({what}): another term began"
        if not self.refused:
            self.refused = True
            log.error("%s; this control plane stops leading and writes nothing more", why)
            self._on_refused(why)
        return Fenced(why)

    async def _write(self, what: str, ops: list[Put | Delete | Get]) -> TxnResult:
        if self.refused:
            raise Fenced(f"term {self.term} is over ({what} not tried)")
        res = await self._store.txn([self._fence()], ops)
        if not res.succeeded:
            raise self._refuse(what)
        return res

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Set a key if this term still holds."""
        return (await self._write(f"put {key}", [Put(key, value, lease)])).revision

    async def delete(self, key: str, end: str | None = None) -> tuple[int, int]:
        """Delete a key or range if this term still holds: (count, revision)."""
        res = await self._write(f"delete {key}", [Get(key, end), Delete(key, end)])
        return len(res.responses[0]), res.revision

    async def txn(
        self,
        compare: list[Compare],
        success: list[Put | Delete | Get],
        failure: list[Put | Delete | Get] | None = None,
    ) -> TxnResult:
        """A transaction that holds only while this term does; raises Fenced when the term is
        over (the caller's compares are judged only within the term). Its failure branch may
        only read: it also runs when the fence fails, when nothing may be written."""
        if any(not isinstance(op, Get) for op in failure or []):
            raise ValueError("a fenced transaction's failure branch may only read")
        if self.refused:
            raise Fenced(f"term {self.term} is over (a transaction not tried)")
        probe = Get(LEADER)
        res = await self._store.txn([self._fence(), *compare], success, [*(failure or []), probe])
        if res.succeeded:
            return res
        leader = res.responses[-1]
        if not leader or leader[0].create_revision != self.term:
            raise self._refuse("a transaction")
        return TxnResult(False, res.revision, res.responses[:-1])

    # Reads and the rest: as the store's

    async def get(self, key: str) -> KV | None:
        """The key's value."""
        return await self._store.get(key)

    async def range(
        self, key: str, end: str | None = None, *, limit: int = 0, revision: int = 0
    ) -> tuple[list[KV], int]:
        """Keys in [key, end)."""
        return await self._store.range(key, end, limit=limit, revision=revision)

    def watch(
        self, key: str, end: str | None = None, *, start_revision: int = 0
    ) -> AsyncIterator[Event]:
        """Events on [key, end)."""
        return self._store.watch(key, end, start_revision=start_revision)

    async def revision(self) -> int:
        """The store's revision."""
        return await self._store.revision()

    async def lease_grant(self, ttl_s: float) -> int:
        """A new lease (leases are not fenced: they change no key)."""
        return await self._store.lease_grant(ttl_s)

    async def lease_keepalive(self, lease: int) -> float:
        """Renew a lease."""
        return await self._store.lease_keepalive(lease)

    async def lease_revoke(self, lease: int) -> None:
        """End a lease (not fenced: the leader's keys carry none)."""
        await self._store.lease_revoke(lease)

    async def close(self) -> None:
        """Nothing: the store is the daemon's to close."""
