"""The leader's Slurm task, for its term: each node's part in Slurm, the kept node list
(saved fenced), and the nodes Slurm holds from llmgw's scheduler (lending and reclaiming)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from llmgw.api_types import SlurmNodeView
from llmgw.wire import Inventory, ReplicaStatus, SlurmPart
from llmgwd.nodes.members import Members
from llmgwd.placement.reconciler import NodeFlags
from llmgwd.placement.scheduler import Placement
from llmgwd.planes.fence import Fenced
from llmgwd.slurm import kept, lending
from llmgwd.slurm.parts import Seen, busy, parts, reported
from llmgwd.slurm.settings import SETTINGS, SettingsStore, SlurmSettings, in_slurm
from llmgwd.store import Store, prefix_end

log = logging.getLogger(__name__)

SLOW_S = 10.0  # looked at again this often without a poke (a report missed, a timer)
HOLD_S = 30.0  # a new leader changes no part before every node of Slurm's is heard, or this
# (with no kept list: slurm.hold_for_s, as the settings say)


class NodeView(Protocol):
    """One node as the cluster state reports it (cluster.NodeInfo)."""

    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def inventory(self) -> Inventory: ...
    @property
    def replicas(self) -> Sequence[ReplicaStatus]: ...


class Nodes(Protocol):
    """What the task needs of the cluster state."""

    def nodes(self) -> Sequence[NodeView]:
        """Every node that registered in this term."""
        ...

    def set_slurm(self, node: str, part: SlurmPart | None) -> None:
        """Tell a node its part in Slurm (None: none)."""
        ...

    def slurm_untold(self, node: str) -> None:
        """Tell a node nothing of Slurm: it keeps its Slurm as it is (no controller known)."""
        ...

    def slurm_loaded(self) -> None:
        """The parts are set: Desired carries them from now on (before: none, pending)."""
        ...


def with_replicas(nodes: Iterable[NodeView], placements: Iterable[Placement]) -> set[str]:
    """The nodes where llmgw has a replica placed or still running."""
    return {p.node for p in placements} | {n.name for n in nodes if n.replicas}


class SlurmTask:
    """Runs while this control plane leads: poked when a node's report or the settings
    change, and every SLOW_S."""

    def __init__(
        self,
        store: Store,
        fenced: Store,
        nodes: Nodes,
        secret: bytes,
        placements: Callable[[], Iterable[Placement]],
        hold: Callable[[Mapping[str, NodeFlags]], None],
        *,
        hold_s: float = HOLD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._fenced = fenced
        self._nodes = nodes
        self._secret = secret
        self._placements = placements
        self._hold = hold
        self._settings = SettingsStore(store)
        self._kept = kept.Kept()
        self._loaded = False  # what the last leader kept is read
        self._hold_s, self._clock = hold_s, clock
        self._since = clock()  # the term's start: parts wait for the nodes until hold_s
        self._ready = False  # the parts are set (every node heard, or hold_s passed)
        self._wake = asyncio.Event()
        self._status: list[SlurmNodeView] = []  # the last pass's, for people

    def poke(self) -> None:
        """Something changed: look again soon."""
        self._wake.set()

    async def load(self) -> None:
        """Read what the last leader kept."""
        self._kept = await kept.load(self._store)
        self._loaded = True

    async def start(self) -> None:
        """Before the term takes agents: load what is kept, and hold the nodes of Slurm's
        from the scheduler at once (a pass that fails is logged; run() tries again)."""
        try:
            await self.step()
        except Fenced:
            raise
        except Exception:
            log.exception("Slurm's first pass failed; trying again")

    async def run(self, revision: int) -> None:
        """Keep the parts for the term (settings watched after revision); the first pass
        loads what is kept."""
        await asyncio.gather(self._loop(), self._follow(revision))

    async def _follow(self, revision: int) -> None:
        end = prefix_end(SETTINGS)
        async for _ in self._store.watch(SETTINGS, end, start_revision=revision + 1):
            self.poke()

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.step()
            except Fenced:
                raise  # the term is over
            except Exception:
                log.exception("Slurm's pass failed; trying again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), SLOW_S)

    async def step(self) -> None:
        """One pass: standings, the scheduler's held nodes, the kept list, every part."""
        if not self._loaded:
            await self.load()
        settings = await self._settings.get()
        if settings.all_nodes:
            settings = in_slurm(settings, await Members(self._store).active())
        infos = list(self._nodes.nodes())
        seen = {n.name: Seen(n.address, n.inventory) for n in infos}
        reports = {n.name: n.inventory.slurm for n in infos}
        names = set(seen) | set(settings.nodes)
        placed = with_replicas(infos, self._placements())
        by_node = lending.standings(settings, names, placed, reports)
        self._hold(lending.held(by_node))
        self._status = [lending.node_status(n, s, reports.get(n)) for n, s in by_node.items()]
        if not self._heard(settings, seen):
            return  # a new leader: no part changes until the nodes are heard
        if settings.enabled:
            await self._keep(settings, seen)
        listed = {n.name for n in self._kept.nodes}
        lent = [n for n in lending.lent_now(by_node) if n in listed]
        told = parts(settings, self._kept, seen, lent, self._secret)
        for name in seen:
            if name in told:
                self._nodes.set_slurm(name, told[name])
            else:
                self._nodes.slurm_untold(name)  # no controller known: slurmd left as it is
        self._nodes.slurm_loaded()

    def _heard(self, settings: SlurmSettings, seen: Mapping[str, Seen]) -> bool:
        """Whether the parts may be set: every node of Slurm's (the controller, those kept
        or set) has registered in this term, or hold_s has passed since it began (one still
        silent keeps what it runs: it gets no part). With no kept list, settings.hold_for_s:
        a node not heard by then is left out of slurm.conf, and its jobs with it."""
        if self._ready:
            return True
        wanted = {settings.controller, *settings.nodes} if settings.enabled else set()
        wanted |= {n.name for n in self._kept.nodes}
        missing = sorted(n for n in wanted - set(seen) if n)
        waited = self._clock() - self._since
        hold = self._hold_s if self._kept.nodes else settings.hold_for_s
        if missing and waited < hold:
            return False
        if missing:
            log.warning("Slurm: %s not heard from in %.0fs; setting the parts without them",
                        ", ".join(missing), waited)  # fmt: skip
        self._ready = True
        return True

    def status(self) -> list[SlurmNodeView]:
        """Each node's standing as the last pass saw it, by name."""
        return list(self._status)

    async def _keep(self, settings: SlurmSettings, seen: Mapping[str, Seen]) -> None:
        """The kept list now, saved through the fenced store when it changed."""
        controller = seen.get(settings.controller)
        address = controller.address if controller is not None else ""
        new = kept.next_kept(
            self._kept, settings, reported(settings, seen), busy(self._kept, seen), address
        )
        if new != self._kept:
            await kept.save(self._fenced, new)
            log.info("Slurm's nodes listed: %s", ", ".join(n.name for n in new.nodes) or "none")
            self._kept = new
