"""The control planes as `llmgw planes` shows them (each one's etcd member, its health and
role), and the rule that keeps a removal from leaving the store without a quorum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import msgspec

from llmgw import wire
from llmgw.api_types import Health, PlaneView
from llmgwd.planes import backup
from llmgwd.planes.tokens import PlaneTokens
from llmgwd.store import Store, prefix_end

# Each live control plane's wire.PlaneInfo, under its lease: the store key keeps its old word,
# which every llmgwd of a rolling upgrade reads.
SERVERS = "/servers/"
LEADER = "/leader"


class Member(msgspec.Struct, frozen=True):
    """One etcd member as its cluster lists it."""

    id: int
    name: str  # "": added, not started yet
    peer_urls: list[str]
    learner: bool = False


class EtcdCluster(Protocol):
    """What the control planes' commands ask of etcd, through this host's member."""

    async def members(self) -> list[Member]:
        """Every member, as the cluster lists it now."""
        ...

    async def add(self, peer_url: str) -> list[Member]:
        """Add a learner at peer_url; every member after (the new one named "")."""
        ...

    async def promote(self, member_id: int) -> bool:
        """Make a learner a voter; False while it has not caught up."""
        ...

    async def remove(self, member_id: int) -> None:
        """Remove a member from the cluster."""
        ...

    async def healthy(self) -> dict[int, bool]:
        """Per member id: whether it is reachable and in the cluster, as this member sees it."""
        ...


@dataclass(frozen=True, slots=True)
class ControlPlanes:
    """What /api/v1/planes works with, supplied by the daemon."""

    store: Store
    etcd: EtcdCluster | None  # None: the store is SQLite (one control plane)
    tokens: PlaneTokens
    me: str  # this control plane's name
    join_url: str  # its cluster port, where a new control plane joins
    backup: backup.Source | None = None  # POST /backup's; None: this llmgwd makes none


class Refusal(Exception):
    """A change to the control planes refused; the message says why and what to do."""


class NoSuchPlane(Refusal):
    """No member of that name."""


_info = msgspec.json.Decoder(wire.PlaneInfo)


class _Leader(msgspec.Struct):
    name: str  # the part of /leader's record (leader.LeaderRecord) this view reads


_leader = msgspec.json.Decoder(_Leader)
_BAD = (msgspec.DecodeError, msgspec.ValidationError)


async def records(store: Store) -> dict[str, wire.PlaneInfo]:
    """The live control planes' records, by name."""
    kvs, _ = await store.range(SERVERS, prefix_end(SERVERS))
    found = {}
    for kv in kvs:
        try:
            info = _info.decode(kv.value)
        except _BAD:
            continue  # a record of a newer llmgwd: shown as a bare member
        found[info.name] = info
    return found


async def leader(store: Store) -> str:
    """Who leads now ("": nobody)."""
    kv = await store.get(LEADER)
    try:
        return _leader.decode(kv.value).name if kv is not None else ""
    except _BAD:
        return ""


def _health(member: Member, healthy: dict[int, bool]) -> Health:
    if not member.name:
        return "not started"
    return "healthy" if healthy.get(member.id) else "unreachable"


async def view(store: Store, etcd: EtcdCluster | None, me: str) -> list[PlaneView]:
    """Every control plane: etcd's members joined with the live records, by name."""
    recs = await records(store)
    lead = await leader(store)
    out: list[PlaneView] = []
    members = await etcd.members() if etcd is not None else []
    healthy = await etcd.healthy() if etcd is not None else {}
    for m in members:
        rec = recs.pop(m.name, None)
        role = "leader" if m.name and m.name == lead else (rec.role if rec else "")
        out.append(PlaneView(
            name=m.name or f"(joining at {', '.join(m.peer_urls)})", url=rec.url if rec else "",
            member=format(m.id, "x"), peer_url=",".join(m.peer_urls),
            health=_health(m, healthy), role=role, learner=m.learner, self=m.name == me,
            version=rec.version if rec else "",
        ))  # fmt: skip
    for name, rec in sorted(recs.items()):
        role = "leader" if name == lead else rec.role
        out.append(PlaneView(name=name, url=rec.url, role=role, self=name == me,
                             version=rec.version))  # fmt: skip
    return sorted(out, key=lambda s: s.name)


def quorum(voters: int) -> int:
    """The members a Raft cluster of this many voters needs to take writes."""
    return voters // 2 + 1


def removal_refusal(members: list[Member], healthy: dict[int, bool], gone: Member) -> str:
    """Why removing member gone would leave the store unusable ("": it would not)."""
    if len(members) <= 1:
        return (
            f"{gone.name} is the last member of the store's cluster: removing it would leave "
            "no store at all"
        )
    left = [m for m in members if m.id != gone.id and not m.learner]
    alive = sum(1 for m in left if healthy.get(m.id))
    need = quorum(len(left))
    if alive < need:
        return (
            f"without {gone.name}, {alive} of the {len(left)} members left are healthy, fewer "
            f"than the {need} their quorum needs: the store would stop taking writes"
        )
    return ""


def find(members: list[Member], name: str) -> Member:
    """The member of that name (or that hex id: a member that never started has no name);
    NoSuchPlane when there is none."""
    for m in members:
        if m.name == name or (not m.name and format(m.id, "x") == name):
            return m
    names = ", ".join(sorted(m.name for m in members if m.name)) or "none"
    raise NoSuchPlane(f"no control plane {name!r} among the store's members ({names})")


async def remove(etcd: EtcdCluster, name: str, *, me: str, force: bool, leaving: bool) -> Member:
    """Remove the member of that name: this one (leaving) or a dead one. Refusal when it is
    the last member (always), or without force when it would break the store's quorum or
    remove a live member other than this one."""
    members = await etcd.members()
    gone = find(members, name)
    if name == me and not leaving:
        raise Refusal(f"{name} is this control plane: run `llmgw plane leave` to take it out")
    healthy = await etcd.healthy()
    why = removal_refusal(members, healthy, gone)
    if len(members) <= 1:
        raise Refusal(why)  # even with force
    if not why and not leaving and healthy.get(gone.id):
        why = f"{name}'s member is healthy: run `llmgw plane leave` on {name} instead"
    if why and not force:
        raise Refusal(f"{why} (--force does it all the same)")
    await etcd.remove(gone.id)
    return gone
