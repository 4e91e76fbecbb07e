"""Which control plane holds which set, and who fetches one from upstream, in the store."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from llmgwd.planes import registry
from llmgwd.store import Compare, Delete, Get, Put, Store, prefix_end

CLAIMS = "/mirror/claims/"  # + the pinned source -> the control plane fetching it upstream
HELD = "/mirror/held/"  # + the pinned source + "/" + a control plane's name: it holds it whole


class Held(msgspec.Struct, frozen=True):
    """A set a control plane holds whole, since when."""

    at: float


_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(Held)


class Holders:
    """This control plane's claims and holdings. A claim is put with its lease, so it goes
    with a dead control plane and another takes the fetch over; a holding stays (the files
    are on that host's disk), and a copy from a holder that lost them fails over to the next."""

    def __init__(self, store: Store, name: str, lease: Callable[[], int]) -> None:
        self._store = store
        self.name = name
        self._lease = lease

    async def claim(self, source: str) -> bool:
        """Whether this control plane fetches source from upstream: the claim was free and is
        now its own, or was its own already (under its present lease)."""
        lease = self._lease()
        if not lease:
            return False  # no lease yet: a claim without one would outlive this process
        key = CLAIMS + source
        mine = Put(key, self.name.encode(), lease=lease)
        r = await self._store.txn([Compare(key, "version", "=", 0)], [mine], [Get(key)])
        if r.succeeded:
            return True
        held = r.responses[0]
        return bool(held) and held[0].lease == lease

    async def release(self, source: str) -> None:
        """Let the claim go (fetched, or failed for now)."""
        key = CLAIMS + source
        await self._store.txn([Compare(key, "value", "=", self.name.encode())], [Delete(key)])

    async def claimant(self, source: str) -> str:
        """The control plane fetching source from upstream now ("": none)."""
        kv = await self._store.get(CLAIMS + source)
        return kv.value.decode() if kv is not None else ""

    async def mark(self, source: str) -> None:
        """This control plane holds source whole."""
        await self._store.put(f"{HELD}{source}/{self.name}", _enc.encode(Held(time.time())))

    async def unmark(self, source: str) -> None:
        """This control plane no longer holds source (swept)."""
        await self._store.delete(f"{HELD}{source}/{self.name}")

    async def holders(self, source: str) -> list[str]:
        """The control planes that hold source whole, by name."""
        head = f"{HELD}{source}/"
        kvs, _ = await self._store.range(head, prefix_end(head))
        return [kv.key[len(head) :] for kv in kvs]

    async def everything(self) -> dict[str, list[str]]:
        """Every set some control plane holds: source -> the control planes, by name."""
        kvs, _ = await self._store.range(HELD, prefix_end(HELD))
        out: dict[str, list[str]] = {}
        for kv in kvs:
            source, _, name = kv.key[len(HELD) :].rpartition("/")
            out.setdefault(source, []).append(name)
        return out

    async def urls(self) -> dict[str, str]:
        """Every live control plane's cluster URL, by name (this one's too)."""
        infos, _ = await registry.read(self._store)
        return {i.name: i.url for i in infos}
