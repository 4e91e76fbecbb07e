"""The roll's order (control planes one at a time, the leader last, then nodes in parallel),
a failure's halt, resume, abort and the steps' reports."""

from __future__ import annotations

from llmgw import wire
from llmgw.api_types import UpgradeRoll
from llmgwd.upgrade import roll

R = "0.2.0"


def _roll(parallel: int = 2) -> UpgradeRoll:
    return roll.plan("r1", R, ["p1", "p2", "p3"], ["p1", "n1", "n2", "n3"], parallel=parallel)


def _finish(r: UpgradeRoll, names: list[str], now: float = 1.0) -> UpgradeRoll:
    for n in names:
        r = roll.started(r, n, now)
    return roll.observed(r, dict.fromkeys(names, R), now)


def test_plan_puts_plane_hosts_once_then_nodes() -> None:
    r = _roll()
    assert [(h.name, h.role) for h in r.hosts] == [
        ("p1", "plane"),
        ("p2", "plane"),
        ("p3", "plane"),
        ("n1", "node"),
        ("n2", "node"),
        ("n3", "node"),
    ]


def test_planes_one_at_a_time_leader_last_then_nodes_bounded() -> None:
    r = _roll(parallel=2)
    order: list[list[str]] = []
    while (due := roll.due(r, leader="p1")) and len(order) < 10:
        order.append(due)
        r = (
            _finish(r, due[:1])
            if len(due) == 1
            else roll.started(roll.started(r, due[0], 1), due[1], 1)
        )
        if len(due) == 2:
            assert roll.due(r, leader="p1") == []  # two nodes in flight: no room
            r = roll.observed(r, dict.fromkeys(due, R), 2.0)
    assert order == [["p2"], ["p3"], ["p1"], ["n1", "n2"], ["n3"]]
    assert r.state == "done"
    assert all(h.step == "done" and h.version == R for h in r.hosts)


def test_no_plane_starts_while_another_is_in_flight() -> None:
    r = roll.started(_roll(), "p2", 1.0)
    assert roll.due(r, leader="p1") == []
    r = roll.reported(r, "p2", wire.UpgradeReport("r1", 1, "installing"), 2.0)
    assert roll.due(r, leader="p1") == []


def test_failure_halts_and_says_why_resume_carries_on() -> None:
    r = _finish(_roll(), ["p2", "p3", "p1"])
    r = roll.started(roll.started(r, "n1", 3.0), "n2", 3.0)
    report = wire.UpgradeReport("r1", 1, "failed", message="apt-get install exited 100")
    r = roll.reported(r, "n1", report, 4.0)
    assert r.state == "halted"
    assert r.error == "n1: apt-get install exited 100"
    assert roll.due(r, leader="p1") == []
    # n2 was in flight: it finishes, and n3 still does not start
    r = roll.observed(r, {"n2": R}, 5.0)
    assert roll.host(r, "n2").step == "done"  # type: ignore[union-attr]
    assert roll.due(r, leader="p1") == []
    r = roll.resume(r, 6.0)
    assert r.state == "running" and r.error == ""
    assert roll.due(r, leader="p1") == ["n1", "n3"]


def test_abort_starts_no_host_and_keeps_those_done() -> None:
    r = _finish(_roll(), ["p2"])
    r = roll.abort(r)
    assert roll.due(r, leader="p1") == []
    assert roll.host(r, "p2").step == "done"  # type: ignore[union-attr]
    assert r.state == "aborted"
    r = _finish(r, ["p3"])  # one in flight at the abort finishes; the roll stays aborted
    assert r.state == "aborted"


def test_reports_count_bytes_and_ignore_another_roll() -> None:
    r = roll.started(_roll(), "p2", 1.0)
    r = roll.reported(r, "p2", wire.UpgradeReport("r1", 1, "fetching", 5, 10), 2.0)
    h = roll.host(r, "p2")
    assert h is not None and (h.step, h.done_bytes, h.total_bytes) == ("fetching", 5, 10)
    r2 = roll.reported(r, "p2", wire.UpgradeReport("old", 1, "failed", message="x"), 3.0)
    assert r2 == r
    # a report of an earlier try (sent before the agent heard the new Upgrade) is stale
    r3 = roll.reported(r, "p2", wire.UpgradeReport("r1", 0, "failed", message="x"), 3.0)
    assert r3 == r


def test_a_host_stuck_in_a_step_fails() -> None:
    r = roll.started(_roll(), "p2", 0.0)
    r = roll.observed(r, {"p2": "0.1.0"}, roll.STEP_LIMIT_S + 1)
    h = roll.host(r, "p2")
    assert h is not None and h.step == "failed" and "still fetching" in h.message
    assert "0.1.0" in h.message and r.state == "halted"


def test_a_host_already_on_the_release_is_done() -> None:
    r = roll.already(_roll(), "p2", 1.0)
    assert roll.host(r, "p2").step == "done"  # type: ignore[union-attr]
    assert roll.due(r, leader="p1") == ["p3"]


def test_installing_is_done_only_once_the_unit_ended_well() -> None:
    """The packages' scripts restart the daemons before dpkg is through: the release seen is
    not enough while the host is installing; its agent's "restarting" is."""
    r = roll.started(_roll(), "p2", 1.0)
    r = roll.reported(r, "p2", wire.UpgradeReport("r1", 1, "installing"), 2.0)
    r = roll.observed(r, {"p2": R}, 3.0)
    assert roll.host(r, "p2").step == "installing"  # type: ignore[union-attr]
    r = roll.reported(r, "p2", wire.UpgradeReport("r1", 1, "restarting"), 4.0)
    r = roll.observed(r, {"p2": R}, 5.0)
    assert roll.host(r, "p2").step == "done"  # type: ignore[union-attr]
