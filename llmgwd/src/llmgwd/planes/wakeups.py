"""On-demand wake-ups from any control plane: the leader's reconciler wakes the model itself;
a standby puts /wake/MODEL, which the leader watches (at most once per WAKE_EVERY_S a model,
so a busy standby keeps a model awake without a store write per request)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

import msgspec

from llmgwd.store import Store, prefix_end

log = logging.getLogger(__name__)

WAKE = "/wake/"
WAKE_EVERY_S = 2.0


class Wake(msgspec.Struct, frozen=True):
    """A request for an on-demand model reached a standby."""

    by: str  # the standby's name
    at: float  # unix time


class Toucher(Protocol):
    """One model at a time: what the router calls touch on."""

    def touch(self, name: str) -> None:
        """A request for model name arrived."""
        ...


class Waker:
    """The router's on_demand on every control plane: the leader's reconciler when this one
    leads (local is not None), else a put of /wake/MODEL for the leader to see."""

    def __init__(
        self,
        store: Store,
        me: str,
        local: Callable[[], Toucher | None],
        lease: Callable[[], int],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._me = me
        self._local = local
        self._lease = lease
        self._clock = clock
        self._sent: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def touch(self, name: str) -> None:
        """Wake model name (or keep it awake), here or through the store."""
        local = self._local()
        if local is not None:
            local.touch(name)
            return
        now = self._clock()
        if now - self._sent.get(name, -WAKE_EVERY_S) < WAKE_EVERY_S:
            return
        self._sent[name] = now
        task = asyncio.create_task(self._put(name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _put(self, name: str) -> None:
        value = msgspec.json.encode(Wake(self._me, time.time()))
        try:
            await self._store.put(WAKE + name, value, lease=self._lease())
        except Exception as e:
            self._sent.pop(name, None)  # the next request tries again
            log.warning("cannot pass the wake-up of %s to the leader (%s)", name, e)


async def follow(store: Store, revision: int, touch: Callable[[str], None]) -> None:
    """The leader's side: touch each model a standby put under WAKE after revision."""
    async for ev in store.watch(WAKE, prefix_end(WAKE), start_revision=revision + 1):
        if ev.type == "put":
            touch(ev.kv.key[len(WAKE) :])
