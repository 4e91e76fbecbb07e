"""An etcd cluster's member API in memory, for the control planes' tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgwd.planes.listing import Member
from llmgwd.store.etcd_http import EtcdError


@dataclass
class FakeEtcd:
    """Members as etcd's member API keeps them; those in down are unreachable."""

    members_: list[Member] = field(
        default_factory=lambda: [Member(1, "cp1", ["https://10.0.0.1:7721"])]
    )
    down: set[int] = field(default_factory=set)
    behind: set[int] = field(default_factory=set)  # learners not caught up yet
    unready: bool = False  # etcd refuses members for now (one connected for under 5 s)

    async def members(self) -> list[Member]:
        return list(self.members_)

    async def add(self, peer_url: str) -> list[Member]:
        if self.unready:
            raise EtcdError(9, "etcdserver: unhealthy cluster")
        if any(m.learner for m in self.members_):
            raise EtcdError(9, "etcdserver: too many learner members in cluster")
        self.members_.append(Member(len(self.members_) + 1, "", [peer_url], learner=True))
        return list(self.members_)

    async def promote(self, member_id: int) -> bool:
        if member_id in self.behind:
            return False
        found = [m for m in self.members_ if m.id == member_id and m.learner]
        if not found:
            raise RuntimeError("etcdserver: can only promote a learner member")
        self.members_ = [Member(m.id, m.name, m.peer_urls) if m in found else m
                         for m in self.members_]  # fmt: skip
        return True

    async def remove(self, member_id: int) -> None:
        self.members_ = [m for m in self.members_ if m.id != member_id]

    async def healthy(self) -> dict[int, bool]:
        return {m.id: m.id not in self.down for m in self.members_ if m.name}
