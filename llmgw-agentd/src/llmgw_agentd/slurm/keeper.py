"""Keeps the node's part in Slurm as the leader's Desired says, on each Desired and every
CHECK_S: a new part set up by the set-up unit (packages, munge's key, the controller's files:
slurm/setup.py), the units' drop-ins (reloaded and started over D-Bus), the drains of nodes
not lent; told no part, it undoes what it did."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgspec

from llmgw.wire import SlurmPart, SlurmReport
from llmgw_agentd.slurm import dropins, files, install, lending, munge, report, setup
from llmgw_agentd.slurm.cmd import SlurmError
from llmgw_agentd.systemd import SystemdError

log = logging.getLogger(__name__)

CHECK_S = 12.0
RETRY_S = 60.0  # a set-up that failed is run again after this
MUNGE = "munge.service"


class Units(Protocol):
    """What the keeper asks of systemd (llmgw_agentd.systemd.Systemd)."""

    async def start(self, name: str) -> str: ...
    async def restart(self, name: str) -> str: ...
    async def stop(self, name: str) -> str: ...
    async def reload(self) -> None: ...


@dataclass
class Paths:
    """Where the keeper and its set-up write (other roots in tests)."""

    units: Path = dropins.RUN_UNITS
    etc: Path = dropins.SLURM_ETC
    munge_key: Path = munge.KEY
    state: Path = files.STATE
    record: Path = Path("/var/lib/llmgw-agent") / files.WRITTEN
    proc: Path = Path("/proc")

    def where(self) -> setup.Where:
        """The set-up's share of these."""
        return setup.Where(str(self.etc), str(self.munge_key), str(self.state), str(self.record))


def _set_up_key(part: SlurmPart) -> SlurmPart:
    """What of a part its set-up depends on (lending and the peers change none of it)."""
    return msgspec.structs.replace(part, lent=[], peers=[])


@dataclass
class Keeper:
    """The node's Slurm; report is what the next heartbeat carries (None: no part)."""

    node: str
    units: Units
    firewall: Callable[[bool, Sequence[str]], None]  # Slurm on, and its peers' addresses
    run_setup: Callable[[setup.Order], Awaitable[setup.Done]]  # setup_unit.SetupUnit
    paths: Paths = field(default_factory=Paths)
    report: SlurmReport | None = None
    _part: SlurmPart | None = None
    _told: bool = False  # a Desired came: before it, nothing is started nor stopped
    _set_up_for: SlurmPart | None = None  # the part (_set_up_key) the last set-up was for
    _probed: tuple[str, str] = ("", "")  # its `slurmd -V` version and `slurmd -C` line
    _failed: str = ""  # why the last set-up failed ("": it did not)
    _failed_at: float = 0.0
    _poked: asyncio.Event = field(default_factory=asyncio.Event)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def look(self) -> None:
        """At the agent's start, before any Desired: a node where Slurm's units run from
        llmgw's drop-ins, or a job step runs, reports so at once (jobs from /proc, no state
        yet), never as a node without Slurm; nothing is started nor stopped."""
        units = (dropins.SLURMD, dropins.SLURMCTLD)
        ran = any(dropins.dropin_path(u, self.paths.units).exists() for u in units)
        jobs = await asyncio.to_thread(report.step_jobs, self.paths.proc)
        if ran or jobs:
            message = "the agent started: waiting for the control plane's part"
            self.report = SlurmReport(jobs=jobs, message=message)

    def set(self, part: SlurmPart | None) -> None:
        """The part the leader's latest Desired gives this node; kept at once."""
        if part != self._part or not self._told:
            self._part, self._told = part, True
            self._poked.set()

    async def run(self) -> None:
        """Keep the part until cancelled (what runs stays: a restarted agent finds it)."""
        while True:
            try:
                await self.step()
            except Exception:
                log.exception("keeping the node's Slurm failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), CHECK_S)
            self._poked.clear()

    async def step(self) -> None:
        """One look: keep the part, or undo it."""
        async with self._lock:
            if not self._told:
                return
            part = self._part
            if part is None:
                await self._undo()
                return
            self.firewall(True, part.peers)
            message = await self._keep(part)
            self.report = await asyncio.to_thread(
                report.read, self.node, part.slurmd, message, self._probed, proc=self.paths.proc
            )

    async def _keep(self, part: SlurmPart) -> str:
        """Everything the part wants; what failed ("": nothing)."""
        try:
            done = await self._set_up(part)
            if done.message:
                return done.message
            await self._munge(done.munge_changed)
            await self._units(part, done.files_changed)
            if part.slurmctld:
                changed = await asyncio.to_thread(lending.keep, part.lent)
                for name, what in changed:
                    log.info("Slurm: %s node %s (lent: %s)", what, name, ", ".join(part.lent))
        except (SlurmError, SystemdError, OSError, ValueError) as e:
            log.warning("the node's Slurm: %s", e)
            return str(e)
        return ""

    async def _set_up(self, part: SlurmPart) -> setup.Done:
        """The set-up unit run for a part it has not yet set up (again RETRY_S after it
        failed); Done() when there is nothing new to do."""
        key = _set_up_key(part)
        if key == self._set_up_for:
            return setup.Done()
        if self._failed and time.monotonic() - self._failed_at < RETRY_S:
            return setup.Done(message=self._failed)
        if missing := install.missing(part):
            log.info("installing %s: journalctl -u %s", ", ".join(missing), setup.UNIT)
            self.report = SlurmReport(message=f"installing {', '.join(missing)}")
        done = await self.run_setup(setup.Order(setup.SET_UP, self.paths.where(), part))
        if done.message:
            self._failed, self._failed_at = done.message, time.monotonic()
            log.warning("setting up the node's Slurm failed: %s", done.message)
            return done
        self._failed, self._set_up_for = "", key
        self._probed = (done.version, done.node_line)
        return done

    async def _munge(self, changed: bool) -> None:
        if changed:
            log.info("munge's key changed: restarting munge")
            await self.units.restart(MUNGE)
        else:
            await self.units.start(MUNGE)

    async def _units(self, part: SlurmPart, ctl_changed: bool) -> None:
        """Write the drop-ins, reload if one changed, start (or restart on a change) each
        unit wanted; stop those no longer wanted."""
        wanted = dropins.wanted(part, self.node)
        changed = {u for u, text in wanted.items() if self._write_dropin(u, text)}
        unwanted = [u for u in (dropins.SLURMD, dropins.SLURMCTLD) if u not in wanted]
        gone = [u for u in unwanted if await self._stop_and_remove(u)]
        if changed or gone:
            await self.units.reload()
        if ctl_changed:
            changed.add(dropins.SLURMCTLD)
        for unit in wanted:  # slurmctld first: slurmd asks it for its files
            if unit in changed:
                log.info("%s: its drop-in or files changed: restarting it", unit)
                await self.units.restart(unit)
            else:
                await self.units.start(unit)

    def _write_dropin(self, unit: str, text: str) -> bool:
        path = dropins.dropin_path(unit, self.paths.units)
        with contextlib.suppress(OSError):
            if path.read_text() == text:
                return False
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return True

    async def _stop_and_remove(self, unit: str) -> bool:
        """Stop a unit the agent ran and remove its drop-in; whether there was one."""
        path = dropins.dropin_path(unit, self.paths.units)
        if not path.exists():
            return False
        await self.units.stop(unit)
        path.unlink()
        with contextlib.suppress(OSError):
            path.parent.rmdir()
        log.info("%s stopped and its drop-in removed: this node has no such part", unit)
        return True

    async def _undo(self) -> None:
        """No part: stop what the agent ran, remove its drop-ins and the files it wrote."""
        try:
            gone = [
                u for u in (dropins.SLURMCTLD, dropins.SLURMD) if await self._stop_and_remove(u)
            ]
            if gone:
                await self.units.reload()
            if self.paths.record.exists():
                done = await self.run_setup(setup.Order(setup.UNDO, self.paths.where()))
                if done.removed:
                    log.info("removed what llmgw wrote: %s", ", ".join(done.removed))
        except (SystemdError, OSError) as e:
            log.warning("undoing the node's Slurm: %s", e)
        self.firewall(False, ())
        self.report = None
        self._set_up_for = None
