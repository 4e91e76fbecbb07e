"""The leader's side of a roll: every few seconds the roll is read from the store, the agents'
reports and the hosts' releases applied, the hosts due told, and the roll written back by
compare-and-set (an abort or a resume written meanwhile wins; the next pass sees it)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable, Sequence

from llmgw import wire
from llmgw.api_types import StagedPackage, UpgradeRoll
from llmgwd.nodes.state import ClusterState
from llmgwd.planes import registry
from llmgwd.store import Store
from llmgwd.upgrade import records, roll

log = logging.getLogger(__name__)

EVERY_S = 2.0
RESEND_S = 10.0  # a host in flight not heard from this long is told again (same try)


class Driver:
    """Carries the stored roll on while this control plane leads."""

    def __init__(
        self,
        store: Store,
        cluster: ClusterState,
        *,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._cluster = cluster
        self._every_s = every_s
        self._clock = clock
        self._heard: dict[str, float] = {}  # host -> when it was last told or heard from

    async def run(self) -> None:
        """Pass after pass until cancelled; a failing pass is logged and tried again."""
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("upgrade: a pass over the roll failed (%s); again soon", e)
            await asyncio.sleep(self._every_s)

    async def tick(self) -> None:
        """One pass."""
        current, revision = await records.roll(self._store)
        reports, self._cluster.upgrade_reports = self._cluster.upgrade_reports, {}
        if current is None or current.state == "done":
            return
        planes, _ = await registry.read(self._store)
        leader = next((p.name for p in planes if p.role == "leader"), "")
        versions = self._versions(current, planes)
        now = self._clock()
        new = current
        for node, report in reports.items():
            name = roll.reporter(new, node)
            self._heard[name] = now
            new = roll.reported(new, name, report, now)
        new = roll.observed(new, versions, now)
        new = await self._start_due(new, leader, versions, now)
        if new != current and await records.put_if(self._store, new, revision):
            _log_changes(current, new)

    def _versions(self, r: UpgradeRoll, planes: list[wire.PlaneInfo]) -> dict[str, str]:
        """Each host's release as seen: a node's agent's; a control plane's host's llmgwd's
        once its agent (if it has one) says the same, "" while that agent is away."""
        out = {n.name: n.version for n in self._cluster.nodes() if n.connected}
        of_plane = {p.name: p.version for p in planes}
        for h in r.hosts:
            if h.role != "plane":
                continue
            plane = of_plane.get(h.name, "")
            agent = self._cluster.node(h.agent or h.name)
            if agent is None:  # none: upgraded by hand, its llmgwd says
                out[h.name] = plane
            elif not agent.connected:
                out[h.name] = ""
            else:
                out[h.name] = plane if agent.version == plane else agent.version
        return out

    async def _start_due(
        self, r: UpgradeRoll, leader: str, versions: dict[str, str], now: float
    ) -> UpgradeRoll:
        staged = [] if r.from_repositories else await records.staged(self._store)
        staged = [p for p in staged if p.release == r.release]
        for name in roll.due(r, leader):
            if versions.get(name) == r.release:
                r = roll.already(r, name, now)
                continue
            r = roll.started(r, name, now, agent=self._agent_of(r, name))
            r = self._tell(r, name, staged, now)
        for h in r.hosts:  # in flight and silent: told again (an agent restarted meanwhile)
            if h.step in ("fetching", "installing") and now - self._heard.get(h.name, 0) > RESEND_S:
                self._tell_again(r, h.name, staged, now)
        return r

    def _tell_again(
        self, r: UpgradeRoll, name: str, staged: Sequence[StagedPackage], now: float
    ) -> None:
        """The same try again; an agent away (restarting onto the packages) is no failure:
        it is told at the next pass it is back (the step's time limit still holds)."""
        h = roll.host(r, name)
        if h is not None:
            msg = _message(r, h.attempt, staged)
            if self._cluster.send_upgrade(h.agent or name, msg) == "":
                self._heard[name] = now

    def _agent_of(self, r: UpgradeRoll, name: str) -> str:
        """The node whose agent upgrades a host: a node itself; a control plane's host, named
        by its advertised address, the node of that name, else the node at that address,
        else the node named by its first label (cp1 for cp1.example.org)."""
        h = roll.host(r, name)
        if h is None or h.role == "node" or self._cluster.node(name) is not None:
            return name
        nodes = self._cluster.nodes()
        at = [n.name for n in nodes if n.address == name]
        short = [n.name for n in nodes if n.name == name.split(".", 1)[0] and not _is_ip(name)]
        return (at or short or [name])[0]

    def _tell(
        self, r: UpgradeRoll, name: str, staged: Sequence[StagedPackage], now: float
    ) -> UpgradeRoll:
        h = roll.host(r, name)
        attempt = h.attempt if h is not None else 0
        msg = _message(r, attempt, staged)
        agent = (h.agent if h is not None else "") or name
        why = self._cluster.send_upgrade(agent, msg)
        self._heard[name] = now
        if why and h is not None and h.role == "plane" and self._cluster.node(agent) is None:
            why = (
                "no llmgw-agentd of this name has registered: a control plane's host is "
                "upgraded through its agent; install the packages there by hand (apt-get or "
                "dnf install ./FILE), then resume"
            )
        if why:
            return roll.failed(r, name, why, now)
        return r


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _message(r: UpgradeRoll, attempt: int, staged: Sequence[StagedPackage]) -> wire.Upgrade:
    """The Upgrade a host is told: the staged packages, or none and from_repositories."""
    packages = [] if r.from_repositories else [_wire(p) for p in staged]
    return wire.Upgrade(r.id, attempt, r.release, packages, r.from_repositories, r.version)


def _wire(p: StagedPackage) -> wire.UpgradePackage:
    return wire.UpgradePackage(p.kind, p.name, p.version, p.arch, p.sha256, p.size, p.filename)


def _log_changes(old: UpgradeRoll, new: UpgradeRoll) -> None:
    """A line per host whose step changed, and the roll's own end or halt."""
    before = {h.name: h.step for h in old.hosts}
    for h in new.hosts:
        if before.get(h.name) != h.step:
            why = f": {h.message}" if h.message else ""
            log.info("upgrade %s: %s %s is %s%s", new.id, h.role, h.name, h.step, why)
    if new.state != old.state:
        log.info("upgrade %s to %s: %s %s", new.id, new.release, new.state, new.error)
