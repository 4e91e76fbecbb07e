"""Node membership kept in the store: who joined, which certificates are live, who was removed."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from llmgwd.store import Compare, Put, Store, prefix_end

NODES = "/members/"


class Member(msgspec.Struct, frozen=True, kw_only=True):
    """One node's record. A removed node keeps its record (no serial live) until it joins
    again with a token."""

    name: str
    serials: list[str] = []  # the certificates the cluster port takes, oldest first
    joined_at: float = 0.0
    removed: bool = False
    removed_at: float = 0.0

    @property
    def active(self) -> bool:
        """A member now (joined and not removed since)."""
        return not self.removed


_SerialsOf = Callable[[Member], list[str]]
_dec = msgspec.json.Decoder(Member)
_enc = msgspec.json.Encoder()


class Members:
    """The membership records, read from the store each time (joins and connections are rare;
    the request path never asks)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def get(self, name: str) -> Member | None:
        """A node's record, or None if it never joined (or joined before records were kept)."""
        kv = await self._store.get(NODES + name)
        return _dec.decode(kv.value) if kv is not None else None

    async def active(self) -> list[str]:
        """The names of the members now (joined and not removed), in order."""
        kvs, _ = await self._store.range(NODES, prefix_end(NODES))
        return sorted(m.name for kv in kvs if (m := _dec.decode(kv.value)).active)

    async def admit(self, name: str, serial: str) -> bool:
        """A token join: a new member, or a removed one back. False if name is a member now."""
        kv = await self._store.get(NODES + name)
        if kv is not None and _dec.decode(kv.value).active:
            return False
        rec = Member(name=name, serials=[serial], joined_at=time.time())
        version = kv.version if kv is not None else 0
        res = await self._store.txn(
            [Compare(NODES + name, "version", "=", version)], [Put(NODES + name, _enc.encode(rec))]
        )
        return res.succeeded

    async def adopt(self, name: str, serial: str) -> bool:
        """A node that joined before records were kept connects: it becomes a member with this
        certificate. False if a record exists (then that record decides)."""
        rec = Member(name=name, serials=[serial], joined_at=time.time())
        res = await self._store.txn(
            [Compare(NODES + name, "version", "=", 0)], [Put(NODES + name, _enc.encode(rec))]
        )
        return res.succeeded

    async def renewed(self, name: str, conn_serial: str, serial: str) -> bool:
        """A member's next certificate: live beside conn_serial (the one its connection was
        admitted with, which it uses until the answer is written) until it is used. False if
        name is not a member now."""
        return await self._change(name, lambda m: [conn_serial, serial])

    async def used(self, name: str, serial: str) -> None:
        """A member connected with serial: if it is its newest, the older ones die."""
        await self._change(name, lambda m: [serial] if m.serials[-1:] == [serial] else m.serials)

    async def remove(self, name: str) -> bool:
        """Revoke every certificate of name; it may come back only by a token join. False if
        name is not a member (never joined, or already removed)."""
        while True:
            kv = await self._store.get(NODES + name)
            old = _dec.decode(kv.value) if kv is not None else None
            if old is not None and not old.active:
                return False
            rec = Member(
                name=name,
                joined_at=old.joined_at if old else 0.0,
                removed=True,
                removed_at=time.time(),
            )
            version = kv.version if kv is not None else 0
            res = await self._store.txn(
                [Compare(NODES + name, "version", "=", version)],
                [Put(NODES + name, _enc.encode(rec))],
            )
            if res.succeeded:
                return True

    async def _change(self, name: str, serials: _SerialsOf) -> bool:
        while True:
            kv = await self._store.get(NODES + name)
            if kv is None:
                return False
            old = _dec.decode(kv.value)
            if not old.active:
                return False
            new = msgspec.structs.replace(old, serials=serials(old))
            if new == old:
                return True
            res = await self._store.txn(
                [Compare(kv.key, "mod", "=", kv.mod_revision)], [Put(kv.key, _enc.encode(new))]
            )
            if res.succeeded:
                return True


def removed_reason(name: str) -> str:
    """What a removed node is told, every time alike (its agent logs it once)."""
    return f"node {name} was removed from the cluster; join it again with a new token"


def refusal(member: Member | None, serial: str) -> str | None:
    """Why the cluster port refuses a certificate of this member (None: it may connect). A
    node without a record joined before records were kept: adopt() decides."""
    if member is None:
        return None
    if not member.active:
        return removed_reason(member.name)
    if serial not in member.serials:
        return (
            f"this certificate of node {member.name} is no longer valid (replaced or revoked); "
            "remove the node (llmgw node remove) and join it again with a new token"
        )
    return None


async def follow(store: Store, on_record: Callable[[Member], None]) -> None:
    """Call on_record with every node's record now and with each one put later, for ever: the
    leader learns of a node removed, or joined again, through another control plane."""
    kvs, revision = await store.range(NODES, prefix_end(NODES))
    for kv in kvs:
        on_record(_dec.decode(kv.value))
    async for ev in store.watch(NODES, prefix_end(NODES), start_revision=revision + 1):
        if ev.type == "put":
            on_record(_dec.decode(ev.kv.value))
