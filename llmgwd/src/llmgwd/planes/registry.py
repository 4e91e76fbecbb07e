"""Every live control plane under /servers/NAME (wire.PlaneInfo, with its own lease, so a
dead one vanishes with it): what `llmgw planes` shows and what agents are told."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec

from llmgw import package_version, wire
from llmgwd.store import Store, prefix_end, schema

log = logging.getLogger(__name__)

SERVERS = "/servers/"  # the store key keeps its old word (a rolling upgrade reads it)

_dec = msgspec.json.Decoder(wire.PlaneInfo)
RECHECK_S = 30.0  # how often a raise of the store's schema still to come is tried again

Members = Callable[[], Awaitable[list[str]]]


class Announcer:
    """Keeps this control plane's /servers/NAME true: put again on each change of role or of
    lease (a lost lease took the key with it). members: the names of the control planes
    joined to the store (etcd's members), running or not; None: this one alone (SQLite)."""

    def __init__(
        self,
        store: Store,
        name: str,
        url: str,
        lease: Callable[[], int],
        members: Members | None = None,
    ) -> None:
        self._store = store
        self._members = members
        self._info = wire.PlaneInfo(
            name, url, since=time.time(), version=package_version(), schema=schema.SCHEMA
        )
        self._lease = lease
        self._due = asyncio.Event()

    def set_role(self, role: wire.PlaneRole, term: int) -> None:
        """This control plane's role changed."""
        if (role, term) != (self._info.role, self._info.term):
            self._info = msgspec.structs.replace(
                self._info, role=role, term=term, since=time.time()
            )
            self._due.set()

    def renew(self) -> None:
        """A new lease: put the key again."""
        self._due.set()

    async def run(self) -> None:
        """Put the key whenever due, for ever."""
        while True:
            try:  # not wait_for, which in 3.11 may swallow a cancel
                async with asyncio.timeout(RECHECK_S):
                    await self._due.wait()
            except TimeoutError:
                await self._try_raise()
                continue
            self._due.clear()
            lease = self._lease()
            if not lease:
                continue  # renew() comes with the next lease
            try:
                value = msgspec.json.encode(self._info)
                await self._store.put(SERVERS + self._info.name, value, lease=lease)
            except Exception as e:
                log.warning("cannot record this control plane in the store (%s)", e)
                await asyncio.sleep(1.0)
                self._due.set()
                continue
            await self._try_raise()

    async def _raise_schema(self) -> None:
        """Once every joined control plane runs and writes this release's schema, the store's
        is raised to it (the last one upgraded in a roll does it as it announces itself). One
        stopped, for its own upgrade or for maintenance, holds it back: it may come back on
        the old release, which a raised schema would refuse."""
        if not await schema.pending(self._store):
            return
        live = {p.name: p.schema for p in (await read(self._store))[0]}
        joined = await self._members() if self._members is not None else [self._info.name]
        planes = [live.get(n) for n in joined] + [s for n, s in live.items() if n not in joined]
        if await schema.raise_to_ours(self._store, planes):
            log.info("the store's schema is now %d: every control plane writes it", schema.SCHEMA)

    async def _try_raise(self) -> None:
        """Raise the schema if due; a failure (the store's members unknown for now) waits for
        the next try, and never holds back this plane's record."""
        try:
            await self._raise_schema()
        except Exception as e:
            log.info("the store's schema cannot be raised now (%s); tried again later", e)


async def read(store: Store) -> tuple[list[wire.PlaneInfo], int]:
    """Every live control plane, and the revision read at."""
    kvs, revision = await store.range(SERVERS, prefix_end(SERVERS))
    return [_dec.decode(kv.value) for kv in kvs], revision


async def follow(store: Store, on_urls: Callable[[list[str]], None]) -> None:
    """Call on_urls with every live control plane's URL now and on each change."""
    servers, revision = await read(store)
    by_key = {SERVERS + s.name: s.url for s in servers}
    on_urls(sorted(by_key.values()))
    async for ev in store.watch(SERVERS, prefix_end(SERVERS), start_revision=revision + 1):
        if ev.type == "put":
            by_key[ev.kv.key] = _dec.decode(ev.kv.value).url
        else:
            by_key.pop(ev.kv.key, None)
        on_urls(sorted(by_key.values()))
