"""A control plane's lease in the store, kept alive, with the deadline its own clock trusts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from llmgwd.store import Store

log = logging.getLogger(__name__)

# The lease is renewed this often (a fraction of its TTL) ...
RENEW_EVERY = 0.25
# ... and trusted only until this fraction of its TTL after the last renewal that succeeded
# was SENT: the store's own countdown started later, so the holder lets go before the store
# does, whatever the delays (a paused process, a slow store, clocks running a little apart).
TRUST_FOR = 0.6


class Session:
    """One lease, granted at start and renewed until close; a new one is granted when it is
    lost (the process was paused past its TTL, the store forgot it). `lease` is 0 while
    there is none; `deadline` is when (on clock) the current one stops being trusted."""

    def __init__(
        self,
        store: Store,
        ttl_s: float,
        *,
        on_new_lease: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self.ttl_s = ttl_s
        self._on_new = on_new_lease
        self._clock = clock
        self.lease = 0
        self.deadline = 0.0
        self._started = clock()
        self._changed = asyncio.Event()  # a lease granted or lost

    def trusted(self) -> bool:
        """Whether the lease is surely still alive in the store (by this process's clock)."""
        return self.lease != 0 and self._clock() < self.deadline

    def untrusted_s(self) -> float:
        """How long the lease has not been trusted: 0 while it is, else the time since the
        last trusted one ran out (or since start, before the first was granted)."""
        if self.trusted():
            return 0.0
        return max(0.0, self._clock() - max(self.deadline, self._started))

    def stale_s(self, grace_s: float) -> float:
        """untrusted_s once it passed grace_s, else 0 (grace_s 0: always 0): how long what
        this control plane knows may have been out of date, when that is too long."""
        untrusted = self.untrusted_s()
        return untrusted if grace_s > 0 and untrusted > grace_s else 0.0

    async def wait_changed(self) -> None:
        """Until a lease is granted or lost."""
        self._changed.clear()
        await self._changed.wait()

    async def run(self) -> None:
        """Grant and keep the lease alive, for ever (cancel to stop; see close)."""
        while True:
            try:
                if self.lease == 0:
                    await self._grant()
                await asyncio.sleep(self.ttl_s * RENEW_EVERY)
                await self._renew()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("the store lease could not be kept (%s); trying again", _why(e))
                await asyncio.sleep(self.ttl_s * RENEW_EVERY)

    async def _grant(self) -> None:
        sent = self._clock()
        lease = await self._store.lease_grant(self.ttl_s)
        self.lease, self.deadline = lease, sent + self.ttl_s * TRUST_FOR
        self._changed.set()
        if self._on_new is not None:
            self._on_new(lease)

    async def _renew(self) -> None:
        sent = self._clock()
        left = self.deadline - sent
        try:
            if left <= 0:
                raise KeyError("not renewed in time")
            await asyncio.wait_for(self._store.lease_keepalive(self.lease), left)
        except (KeyError, TimeoutError) as e:
            log.warning("the store lease %x is lost (%s); taking a new one", self.lease, _why(e))
            self.lease = 0
            self._changed.set()
            return
        self.deadline = sent + self.ttl_s * TRUST_FOR

    async def close(self) -> None:
        """Give the lease back (its keys vanish at once rather than at its TTL)."""
        lease, self.lease = self.lease, 0
        if lease:
            with contextlib.suppress(Exception):
                await self._store.lease_revoke(lease)


def _why(e: BaseException) -> str:
    return str(e) or type(e).__name__
