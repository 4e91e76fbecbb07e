"""The nodes slurm.conf lists and the controller's address, kept in the store by the leader
(through its fenced store), so a new leader writes the same files until the nodes report
again, and never a slurm.conf that drops a node with a job on it."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from llmgwd.slurm.conf import SlurmNode
from llmgwd.slurm.settings import SlurmSettings
from llmgwd.store import Store

KEPT = "/slurm/kept"


class Kept(msgspec.Struct, frozen=True):
    """What the last leader listed in slurm.conf."""

    controller_address: str = ""
    nodes: list[SlurmNode] = []
    controller: str = ""  # the node controller_address is of ("": a leader older than it)


def next_kept(
    kept: Kept,
    settings: SlurmSettings,
    reported: Mapping[str, SlurmNode],
    busy: set[str],
    controller_address: str,
) -> Kept:
    """The nodes to list now: each of settings.nodes as it last reported (or as kept, until it
    reports), plus any kept node that still has a job even if settings dropped it. A node
    neither reported nor kept is not listed yet (its hardware is not known)."""
    before = {n.name: n for n in kept.nodes}
    names = [n for n in settings.nodes if n in reported or n in before]
    names += [n for n in before if n not in settings.nodes and n in busy]
    nodes = [reported.get(n) or before[n] for n in sorted(names)]
    same = kept.controller == settings.controller
    address = controller_address or (kept.controller_address if same else "")
    return Kept(address, nodes, settings.controller)


_dec = msgspec.json.Decoder(Kept)
_enc = msgspec.json.Encoder()


async def load(store: Store) -> Kept:
    """What is kept (nothing, before the first leader kept anything)."""
    kv = await store.get(KEPT)
    return _dec.decode(kv.value) if kv is not None else Kept()


async def save(fenced: Store, kept: Kept) -> None:
    """Keep kept: give the leader's FencedStore (a term that is over raises Fenced)."""
    await fenced.put(KEPT, _enc.encode(kept))
