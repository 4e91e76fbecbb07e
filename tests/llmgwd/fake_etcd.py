"""An etcd cluster's member API in memory, for the control planes' tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgwd.control_planes import Member


@dataclass
class FakeEtcd:
    """Members as etcd's member API keeps them; those in down are unreachable."""

    members_: list[Member] = field(
        default_factory=lambda: [Member(1, "cp1", ["https://10.0.0.1:7721"])]
    )
    down: set[int] = field(default_factory=set)

    async def members(self) -> list[Member]:
        return list(self.members_)

    async def add(self, peer_url: str) -> list[Member]:
        self.members_.append(Member(len(self.members_) + 1, "", [peer_url]))
        return list(self.members_)

    async def remove(self, member_id: int) -> None:
        self.members_ = [m for m in self.members_ if m.id != member_id]

    async def healthy(self) -> dict[int, bool]:
        return {m.id: m.id not in self.down for m in self.members_ if m.name}
