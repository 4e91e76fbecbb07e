"""A control plane's role: what the leader runs for its term (the reconciler over the fenced
store, the agents, the published replicas, the standbys' wake-ups), and the reconciler's
views the API reads whichever the role (a standby's are read from the store)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from llmgw.api_types import SlurmNodeView
from llmgw.errors import ApiError
from llmgwd.catalog import Catalog, Model
from llmgwd.nodes import members
from llmgwd.nodes.state import ClusterState
from llmgwd.placement.profiles import Profile
from llmgwd.placement.reconciler import Failure, NodeFlags, Reconciler
from llmgwd.placement.scheduler import Placement, Verdict
from llmgwd.planes import registry, wakeups
from llmgwd.planes.fence import Fenced, FencedStore
from llmgwd.planes.leader import Election
from llmgwd.planes.live import Publisher
from llmgwd.slurm.task import SlurmTask
from llmgwd.store import Store
from llmgwd.upgrade.driver import Driver

log = logging.getLogger(__name__)

VIEW_EVERY_S = 5.0  # a standby reads the leader's placements, flags and failures this often


class Roles:
    """Runs the leader's work while this process leads; the API's Scheduling either way."""

    def __init__(
        self,
        store: Store,
        catalog: Catalog,
        cluster: ClusterState,
        secret: bytes,
        election: Election,
        announcer: registry.Announcer,
        *,
        grace_s: float,
        isolated_cache: bool = False,  # client.cache_isolation is not none (ReplicaSpec's)
        slurm_hold_s: float = 30.0,  # a new leader's wait for the nodes (slurm/task.py)
    ) -> None:
        self._isolated_cache = isolated_cache
        self._slurm_hold_s = slurm_hold_s
        self._store = store
        self._catalog = catalog
        self._cluster = cluster
        self._secret = secret
        self._election = election
        self._announcer = announcer
        self._grace_s = grace_s
        self.reconciler: Reconciler | None = None  # the running one, while leading
        self.slurm: SlurmTask | None = None  # Slurm's parts and lending, while leading
        self._view = self._new_reconciler(store, 0)  # a standby's, read from the store
        cluster.leading = False
        election.on_change(self._leader_changed)

    def _new_reconciler(self, store: Store, term: int) -> Reconciler:
        fenced = FencedStore(store, term, self._election.step_down)
        return Reconciler(fenced, self._catalog, self._cluster, self._secret,
                          grace_s=self._grace_s, isolated_cache=self._isolated_cache)  # fmt: skip

    def poke(self) -> None:
        """The catalog changed: the leader reconciles soon."""
        if self.reconciler is not None:
            self.reconciler.poke()

    async def lead(self, term: int) -> None:
        """The leader's work for one term; cancelled when the term ends."""
        rec = self._new_reconciler(self._store, term)
        publisher = Publisher(FencedStore(self._store, term, self._election.step_down),
                              self._cluster, grace_s=self._grace_s)  # fmt: skip
        revision = await self._store.revision()
        slurm = SlurmTask(self._store, FencedStore(self._store, term, self._election.step_down),
                          self._cluster, self._secret, rec.placements, rec.hold,
                          hold_s=self._slurm_hold_s)  # fmt: skip
        await slurm.start()  # Slurm's nodes held before any agent is taken

        def changed(_node: str) -> None:
            rec.poke()
            publisher.poke()
            slurm.poke()

        self._cluster.on_change = changed
        self._cluster.leading = True
        self.reconciler = self._view = rec
        self.slurm = slurm
        self._announcer.set_role("leader", term)
        work = [
            rec.run(),
            publisher.run(),
            wakeups.follow(self._store, revision, rec.touch),
            registry.follow(self._store, self._cluster.set_control_planes),
            members.follow(self._store, self._member_changed),
            slurm.run(revision),
            # llmgw upgrade's roll, carried on where the last leader left it
            Driver(FencedStore(self._store, term, self._election.step_down), self._cluster).run(),
        ]
        try:
            await asyncio.gather(*work)
        finally:
            self.reconciler = self.slurm = None
            self._cluster.on_change = None
            self._cluster.stand_by("")
            self._announcer.set_role("standby", 0)

    def _member_changed(self, member: members.Member) -> None:
        """A node's record as stored (`llmgw node remove` or a token join may have been
        answered by a standby): the leader drops a removed node, takes one joined again."""
        if member.active:
            self._cluster.allow(member.name)
        elif not self._cluster.removed(member.name):
            self._cluster.remove(member.name)

    def _leader_changed(self) -> None:
        leader = self._election.leader
        if not self._election.leading:
            self._cluster.leader_url = leader.url if leader is not None else ""

    async def follow_view(self) -> None:
        """While standing by, read the leader's placements, flags and failures again every
        VIEW_EVERY_S (for `llmgw model list`, `llmgw nodes` and plans asked of a standby)."""
        while True:
            if self.reconciler is None:
                view = self._new_reconciler(self._store, 0)
                with contextlib.suppress(Exception):
                    await view.load()
                    if self.reconciler is None:
                        self._view = view
            await asyncio.sleep(VIEW_EVERY_S)

    # The API's Scheduling

    def awake(self, model: Model) -> bool:
        """Whether the model's replicas are wanted now."""
        return self._view.awake(model)

    def flags(self, node: str) -> NodeFlags:
        """What an admin said of node."""
        return self._view.flags(node)

    async def set_flags(self, node: str, flags: NodeFlags) -> None:
        """Cordon, drain or uncordon a node: the leader's to do (a term that ended under the
        write, its fence refusing it, is not the leader either)."""
        if self.reconciler is None:
            raise self._not_leader()
        try:
            await self.reconciler.set_flags(node, flags)
        except Fenced:
            raise self._not_leader() from None

    def _not_leader(self) -> ApiError:
        leader = self._election.leader
        known = leader is not None and leader != self._election.me  # not this one's old term
        where = f"; the leader is {leader.url}" if leader is not None and known else ""
        message = f"this control plane is not the leader{where}: ask the leader"
        return ApiError(503, message, "server_error", "not_leader")

    def placements(self) -> list[Placement]:
        """Where every replica is."""
        return self._view.placements()

    def failures(self) -> list[Failure]:
        """Where models failed to start."""
        return self._view.failures()

    def explain(self, model: Model) -> list[tuple[Profile, list[Verdict]]]:
        """Per profile, where one more replica would go or why not."""
        return self._view.explain(model)

    def rollout(self, model: Model) -> str:
        """The model's replicas' roll to new settings, as people read it ("" when none)."""
        return self._view.rollout(model)

    def slurm_status(self) -> list[SlurmNodeView] | None:
        """Each node's standing between llmgw and Slurm (None: a standby, which knows none)."""
        return self.slurm.status() if self.slurm is not None else None

    def oom_kills(self, model: str) -> dict[str, int]:
        """A model's engines' OOM kills by profile."""
        return self._view.oom_kills(model)
