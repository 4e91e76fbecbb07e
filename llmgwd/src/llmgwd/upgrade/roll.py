"""The roll's state machine, pure: which hosts start next (control planes one at a time, the
leader last, then nodes `parallel` at once), what a report or a version seen does, a failure's
halt, resume and abort."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from msgspec import structs

from llmgw import wire
from llmgw.api_types import UpgradeHost, UpgradeRoll

IN_FLIGHT = frozenset({"fetching", "installing", "restarting"})
STEP_LIMIT_S = 900.0  # a host in one step longer than this has failed


def plan(
    roll_id: str,
    release: str,
    planes: Sequence[str],
    nodes: Iterable[str],
    *,
    parallel: int = 4,
    now: float = 0.0,
    from_repositories: bool = False,
    version: str = "",
) -> UpgradeRoll:
    """A new roll: every control plane's host, then every node that is not one."""
    hosts = [UpgradeHost(name=p, role="plane", since=now) for p in planes]
    hosts += [UpgradeHost(name=n, role="node", since=now) for n in nodes if n not in planes]
    return UpgradeRoll(
        id=roll_id, release=release, hosts=hosts, parallel=max(1, parallel), started_at=now,
        from_repositories=from_repositories, version=version,
    )  # fmt: skip


def due(roll: UpgradeRoll, leader: str) -> list[str]:
    """The hosts to start now: none unless running; a control plane's host when no other is
    in flight (the leader's only when it is the last), the nodes once every plane is done."""
    if roll.state != "running":
        return []
    planes = [h for h in roll.hosts if h.role == "plane"]
    if any(h.step != "done" for h in planes):
        if any(h.step in IN_FLIGHT for h in planes):
            return []
        waiting = [h.name for h in planes if h.step == "waiting"]
        others = [n for n in waiting if n != leader]
        return others[:1] or waiting[:1]
    nodes = [h for h in roll.hosts if h.role == "node"]
    room = roll.parallel - sum(1 for h in nodes if h.step in IN_FLIGHT)
    return [h.name for h in nodes if h.step == "waiting"][: max(0, room)]


def _set(roll: UpgradeRoll, name: str, **changes: object) -> UpgradeRoll:
    hosts = [structs.replace(h, **changes) if h.name == name else h for h in roll.hosts]
    return structs.replace(roll, hosts=hosts)


def host(roll: UpgradeRoll, name: str) -> UpgradeHost | None:
    """The roll's record of one host."""
    return next((h for h in roll.hosts if h.name == name), None)


def started(roll: UpgradeRoll, name: str, now: float, agent: str = "") -> UpgradeRoll:
    """The host was told to upgrade (through agent's node, where that is another name)."""
    h = host(roll, name)
    attempt = (h.attempt if h is not None else 0) + 1
    return _set(roll, name, step="fetching", message="", done_bytes=0, since=now,
                attempt=attempt, agent=agent if agent != name else "")  # fmt: skip


def reporter(roll: UpgradeRoll, node: str) -> str:
    """The host a node's report is of: the one in flight through that node's agent, else the
    node itself."""
    through = [h.name for h in roll.hosts if h.agent == node and h.step in IN_FLIGHT]
    return through[0] if through else node


def failed(roll: UpgradeRoll, name: str, why: str, now: float) -> UpgradeRoll:
    """The host failed: the roll halts where it is and says why (a roll aborted stays so)."""
    roll = _set(roll, name, step="failed", message=why, since=now)
    if roll.state == "running":
        roll = structs.replace(roll, state="halted", error=f"{name}: {why}")
    return roll


def reported(roll: UpgradeRoll, name: str, report: wire.UpgradeReport, now: float) -> UpgradeRoll:
    """An agent's report of its part in this roll (another roll's, or a host done, is
    ignored)."""
    h = host(roll, name)
    if h is None or h.step in ("done", "waiting", "failed"):
        return roll
    if report.roll != roll.id or report.attempt != h.attempt:  # an earlier try's
        return roll
    if report.step == "failed":
        return failed(roll, name, report.message or "failed", now)
    if report.step == "done":  # nothing to install here: it stays on its release
        return _done(roll, name, h.version, report.message, now)
    since = h.since if report.step == h.step else now
    return _set(
        roll,
        name,
        step=report.step,
        done_bytes=report.done_bytes,
        total_bytes=report.total_bytes,
        message=report.message,
        since=since,
    )


def _done(roll: UpgradeRoll, name: str, version: str, message: str, now: float) -> UpgradeRoll:
    roll = _set(roll, name, step="done", version=version, message=message, since=now)
    if roll.state != "aborted" and all(h.step == "done" for h in roll.hosts):
        roll = structs.replace(roll, state="done", error="")
    return roll


def observed(roll: UpgradeRoll, versions: Mapping[str, str], now: float) -> UpgradeRoll:
    """Each host's release as last seen (a node's agent, a control plane's llmgwd): one on the
    roll's release is done, but one installing only once its agent has said the install unit
    ended well ("restarting": the packages' scripts restart the daemons before dpkg is
    through); one in a step past STEP_LIMIT_S has failed."""
    for h in roll.hosts:
        seen = versions.get(h.name, "")
        if seen and seen != h.version and h.step != "done":
            roll = _set(roll, h.name, version=seen)
        if h.step in ("fetching", "restarting") and seen == roll.release:
            roll = _done(roll, h.name, seen, "", now)
        elif h.step in IN_FLIGHT and now - h.since > STEP_LIMIT_S:
            why = f"still {h.step} after {STEP_LIMIT_S:.0f} s (on {seen or 'an unknown release'})"
            roll = failed(roll, h.name, why, now)
    return roll


def already(roll: UpgradeRoll, name: str, now: float) -> UpgradeRoll:
    """A host due that runs the roll's release already: done without being told."""
    return _done(roll, name, roll.release, "already on this release", now)


def resume(roll: UpgradeRoll, now: float) -> UpgradeRoll:
    """A halted roll runs again: its failed hosts wait for their turn once more."""
    hosts = [
        structs.replace(h, step="waiting", message="", since=now) if h.step == "failed" else h
        for h in roll.hosts
    ]
    return structs.replace(roll, hosts=hosts, state="running", error="")


def abort(roll: UpgradeRoll) -> UpgradeRoll:
    """No new host starts; those in flight finish (a package manager is not stopped
    midway) and hosts done stay upgraded."""
    return structs.replace(roll, state="aborted")
