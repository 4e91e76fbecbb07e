"""A fake node for bench/router: joins llmgwd's real cluster port and reports every replica
placed on it as ready on the mock's port, so the router sends to the mock as to an engine.

It uses the agent's own join and link (llmgw_agentd.link), so what llmgwd sees is what a
real llmgw-agentd sends; only the engines are missing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from llmgw import wire
from llmgw_agentd import link

VERSION = "bench"
# The mock serves any number of requests at once; an engine tells the router its slots
# (llama.cpp's /props), which cap what the router sends it. Reported where the wire has it.
SLOTS = 10_000
_HAS_SLOTS = "slots" in wire.ReplicaStatus.__struct_fields__


class FakeNode:
    """Every replica the control plane wants here is 'ready' on the same mock port."""

    def __init__(self, address: str, port: int) -> None:
        self.address = address
        self.port = port
        self.specs: list[wire.ReplicaSpec] = []
        self.link: link.Link | None = None
        self.got_desired = asyncio.Event()

    def inventory(self) -> wire.Inventory:
        return wire.Inventory(cores=1, memory_bytes=1 << 34, memory_free_bytes=1 << 33)

    def replicas(self) -> list[wire.ReplicaStatus]:
        extra: dict[str, Any] = {"slots": SLOTS} if _HAS_SLOTS else {}
        return [
            wire.ReplicaStatus(id=s.id, model=s.model, state="ready", port=self.port, **extra)
            for s in self.specs
        ]

    async def on_desired(self, specs: list[wire.ReplicaSpec]) -> None:
        self.specs = list(specs)
        if self.link is not None:
            self.link.poke()  # report them ready now, not at the next heartbeat
        self.got_desired.set()


@contextlib.asynccontextmanager
async def joined(
    url: str, token: str, pki_dir: Path, node: str, address: str, port: int
) -> AsyncIterator[FakeNode]:
    """Join with token, keep the link up for the block, then close it."""
    await link.join(url, token, node, pki_dir)
    fake = FakeNode(address, port)
    fake.link = link.Link(
        url,
        pki_dir,
        node,
        version=VERSION,
        inventory=fake.inventory,
        replicas=fake.replicas,
        on_desired=fake.on_desired,
        address=address,
    )
    task = asyncio.create_task(fake.link.run())
    try:
        yield fake
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
