"""The store's health as this control plane sees it: its etcd members (voting, healthy) and
whether it has a quorum, checked in the background rather than at each scrape. SQLite is this
host's own file: one member, healthy, its own quorum while llmgwd runs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from llmgwd.metrics.scrape import Fixed
from llmgwd.planes.listing import EtcdCluster, Member, quorum

log = logging.getLogger(__name__)

CHECK_S = 15.0  # the members asked this often
CHECK_TIMEOUT_S = 10.0  # a check that takes longer finds no quorum


@dataclass(frozen=True, slots=True)
class Health:
    """The store's members as last checked."""

    backend: str  # "etcd" or "sqlite"
    voters: int  # voting members (learners count toward no quorum)
    healthy: int  # voting members healthy, as this control plane's member sees them
    learners: int
    quorum: bool  # a linearizable read answered and a majority of the voters are healthy


SQLITE = Health("sqlite", 1, 1, 0, True)


def judged(members: list[Member], healthy: dict[int, bool], answered: bool) -> Health:
    """The health of members, healthy by id; answered: whether the member list (a
    linearizable read, which needs a quorum) came back."""
    voters = [m for m in members if not m.learner]
    up = sum(1 for m in voters if healthy.get(m.id))
    quorate = answered and bool(voters) and up >= quorum(len(voters))
    return Health("etcd", len(voters), up, len(members) - len(voters), quorate)


class StoreHealth:
    """The store's health, checked every CHECK_S (a scrape reads the last check)."""

    def __init__(self, etcd: EtcdCluster | None, *, check_s: float = CHECK_S) -> None:
        self._etcd, self.check_s = etcd, check_s
        self._members: list[Member] = []  # as last listed
        self.health = SQLITE if etcd is None else Health("etcd", 0, 0, 0, False)

    async def check(self) -> Health:
        """Ask the members now (etcd); SQLite's needs no asking."""
        if self._etcd is None:
            return self.health
        answered = True
        try:
            self._members = await asyncio.wait_for(self._etcd.members(), CHECK_TIMEOUT_S)
        except Exception as e:  # no answer is what this tells
            log.info("the store's members did not answer: %s", e)
            answered = False
        try:
            healthy = await asyncio.wait_for(self._etcd.healthy(), CHECK_TIMEOUT_S)
        except Exception:  # nor any health
            healthy = {}
        self.health = judged(self._members, healthy, answered)
        return self.health

    async def run(self) -> None:
        """Check now and every check_s (nothing to do on SQLite)."""
        while self._etcd is not None:
            await self.check()
            await asyncio.sleep(self.check_s)

    def snapshot(self) -> Fixed[Health]:
        """The last check, its series built wherever they are collected."""
        return Fixed(families, self.health)


def families(health: Health) -> Iterator[Metric]:
    """llmgw_store_quorum, llmgw_store_voters, llmgw_store_voters_healthy, llmgw_store_learners."""
    labels, value = ["backend"], [health.backend]
    for name, text, n in (
        ("llmgw_store_quorum", "1 while this control plane's store has a quorum (a "
         "linearizable read answers, a majority of its voting members healthy).",
         int(health.quorum)),
        ("llmgw_store_voters", "The store's voting members (SQLite: 1).", health.voters),
        ("llmgw_store_voters_healthy", "The store's voting members healthy, as this control "
         "plane's member sees them.", health.healthy),
        ("llmgw_store_learners", "Members joining the store, not voting yet.", health.learners),
    ):  # fmt: skip
        family = GaugeMetricFamily(name, text, labels=labels)
        family.add_metric(value, n)
        yield family
