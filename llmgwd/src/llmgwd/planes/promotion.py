"""Joined etcd members promoted: a new control plane's member joins as a learner (it counts
toward no quorum, so one that never starts cannot stop the store) and every control plane
promotes a learner to a voter once etcd says it has caught up."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from llmgwd.planes.listing import EtcdCluster, Member

log = logging.getLogger(__name__)

EVERY_S = 2.0  # how often the members are looked at
GIVE_UP_S = 900.0  # a learner not caught up after this long is left a learner (said once)


class Promoter:
    """Promotes the store's learners, each tried for at most GIVE_UP_S from when seen.

    Every control plane runs one: etcd takes the first promotion and refuses the others as it
    refuses a learner not caught up, so which one promotes does not matter, and a control
    plane restarted or gone leaves the others to do it.
    """

    def __init__(self, etcd: EtcdCluster, clock: Callable[[], float] = time.monotonic) -> None:
        self._etcd = etcd
        self._clock = clock
        self._seen: dict[int, float] = {}  # learner id: when first seen
        self._given_up: set[int] = set()

    async def run(self) -> None:
        """Look every EVERY_S, for ever; a failing store is retried, said once a minute."""
        failing_since = -1e9
        while True:
            try:
                await self.once()
            except Exception as e:
                if self._clock() - failing_since > 60:
                    log.warning("cannot look at the store's learners now (%s)", type(e).__name__)
                    failing_since = self._clock()
            await asyncio.sleep(EVERY_S)

    async def once(self) -> list[Member]:
        """Try to promote each learner now; the members promoted."""
        learners = [m for m in await self._etcd.members() if m.learner]
        self._seen = {m.id: self._seen.get(m.id, self._clock()) for m in learners}
        promoted = []
        for m in learners:
            if m.id in self._given_up:
                continue
            if await self._etcd.promote(m.id):
                log.warning("etcd member %s (%x) caught up: promoted to a voter", _name(m), m.id)
                promoted.append(m)
            elif self._clock() - self._seen[m.id] > GIVE_UP_S:
                self._given_up.add(m.id)
                log.error(
                    "etcd member %s (%x) has not caught up in %d s: left a learner (it counts "
                    "toward no quorum); start its llmgw-etcd, or `llmgw plane remove %x`",
                    _name(m), m.id, GIVE_UP_S, m.id,
                )  # fmt: skip
        return promoted


def _name(m: Member) -> str:
    return m.name or "at " + ",".join(m.peer_urls)
