"""Deleting files no model uses, on the mirror and on every node, and saying what really went."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Iterable
from typing import Protocol

from llmgw import wire
from llmgw.api_types import NodeSweep, SweepOut
from llmgw.blobstore import BlobStore

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 30.0  # how long a node has to list its files again after a sweep


class NodeFiles(Protocol):
    """The nodes' caches as the control plane sees them (their Holdings), and the way to them."""

    def connected(self) -> list[str]:
        """Nodes linked to this control plane now."""
        ...

    def held(self, node: str) -> list[wire.HeldFile] | None:
        """The files a node last listed; None if it never did."""
        ...

    def send_sweep(self, node: str, msg: wire.Sweep) -> bool:
        """Tell a node to delete files; False if it is not connected."""
        ...

    async def swept(
        self,
        node: str,
        sweep_id: str,
        timeout: float,  # noqa: ASYNC109 (each node's answer has its own bound)
    ) -> list[wire.HeldFile] | None:
        """The node's list of files given in answer to a sweep; None if none came in time."""
        ...


def mirror_part(store: BlobStore, used: set[str], only: set[str] | None, dry_run: bool) -> SweepOut:
    """Delete (or list) the mirror's files no model uses; `only` narrows to some files."""
    held = {h.sha256: h.size for h in store.held()}
    gone = sorted(s for s in held if s not in used and (only is None or s in only))
    freed = 0
    for sha in gone:
        freed += held[sha] if dry_run else store.remove(sha)
    if gone and not dry_run:
        log.info("mirror: %d files deleted, %d bytes freed", len(gone), freed)
    return SweepOut(dry_run=dry_run, files=len(gone), bytes=freed, paths=gone)


async def nodes_part(
    nodes: NodeFiles, used: set[str], only: set[str] | None, dry_run: bool
) -> list[NodeSweep]:
    """Each connected node deletes the files it lists that no model uses; what it freed is
    what it no longer lists in its answer, not what it was asked."""
    jobs = [_one(nodes, n, used, only, dry_run) for n in sorted(nodes.connected())]
    return list(await asyncio.gather(*jobs))


async def _one(
    nodes: NodeFiles, node: str, used: set[str], only: set[str] | None, dry_run: bool
) -> NodeSweep:
    before = {h.sha256: h.size for h in nodes.held(node) or []}
    remove = sorted(s for s in before if s not in used and (only is None or s in only))
    if dry_run or not remove:
        return NodeSweep(node=node, files=len(remove), bytes=sum(before[s] for s in remove))
    sweep_id = secrets.token_hex(8)
    if not nodes.send_sweep(node, wire.Sweep(id=sweep_id, remove=remove)):
        return NodeSweep(node=node, files=0, bytes=0, answered=False)
    after = await nodes.swept(node, sweep_id, ANSWER_TIMEOUT_S)
    if after is None:
        log.warning("node %s did not list its files after a sweep in time", node)
        return NodeSweep(node=node, files=0, bytes=0, answered=False)
    now = {h.sha256 for h in after}
    went = [s for s in before if s not in now]
    kept = sum(1 for s in remove if s in now)
    return NodeSweep(node=node, files=len(went), bytes=sum(before[s] for s in went), kept=kept)


def used_by(files: Iterable[Iterable[wire.ModelFile]]) -> set[str]:
    """The sha256s some model's set uses."""
    return {f.sha256 for fs in files for f in fs if f.sha256}
