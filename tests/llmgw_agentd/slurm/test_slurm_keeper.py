"""The agent's Slurm keeper: Slurm's real output read back (recorded from 22.05.8, see
recorded/README.md), the drains it keeps, and what it does to units and files (fake systemd)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import msgspec
import pytest

from llmgw.wire import SLURM_NOT_LENT, SlurmPart, SlurmReport
from llmgw_agentd.slurm import install, keeper, lending, report, setup
from llmgw_agentd.slurm.cmd import SlurmError

REC = Path(__file__).parent / "recorded"
KEY = base64.b64encode(b"k" * 64).decode()
PART = SlurmPart(
    slurmd=True, slurmctld=True, conf_server="10.0.0.9:6817", munge_key=KEY,
    slurm_conf="# Made by llmgw\nClusterName=llmgw\n", cgroup_conf="CgroupPlugin=autodetect\n",
    lent=["n1"], conf_hash="h1", peers=["10.0.0.9", "10.0.0.11"],
)  # fmt: skip


def sinfo(name: str) -> str:
    return (REC / f"sinfo-{name}.txt").read_text()


def test_slurms_states_and_reasons_are_read_from_sinfo() -> None:
    assert lending.nodes(sinfo("drained-registered")) == {"n1": ("drained", SLURM_NOT_LENT)}
    assert lending.nodes(sinfo("idle")) == {"n1": ("idle", "")}
    assert lending.nodes(sinfo("running")) == {"n1": ("mixed", "")}
    assert lending.nodes(sinfo("draining")) == {"n1": ("draining", "admin")}


def test_a_lent_node_llmgw_drained_is_resumed_and_one_not_lent_drained() -> None:
    drained = lending.nodes(sinfo("drained-registered"))
    assert lending.actions(drained, ["n1"]) == [("n1", "resume")]
    assert lending.actions(drained, []) == []  # drained already
    assert lending.actions(lending.nodes(sinfo("running")), []) == [("n1", "drain")]
    assert lending.actions(lending.nodes(sinfo("idle")), ["n1"]) == []


def test_an_admins_drain_is_never_lifted_nor_overwritten() -> None:
    admin = lending.nodes(sinfo("draining"))
    assert lending.actions(admin, ["n1"]) == []
    assert lending.actions(admin, []) == []
    # Not responding yet: Slurm refuses a resume ("Invalid node state specified").
    assert lending.actions({"n1": ("drained*", SLURM_NOT_LENT)}, ["n1"]) == []


def test_keep_drains_with_llmgws_reason_through_scontrol() -> None:
    calls: list[list[str]] = []

    def runner(argv: list[str]) -> str:
        calls.append(argv)
        return "n1|idle|none\nn2|drained|llmgw: not lent to Slurm\n" if argv[0] == "sinfo" else ""

    assert lending.keep(["n2"], runner) == [("n1", "drain"), ("n2", "resume")]
    assert calls[1:] == [
        ["scontrol", "update", "NodeName=n1", "State=DRAIN", f"Reason={SLURM_NOT_LENT}"],
        ["scontrol", "update", "NodeName=n2", "State=RESUME"],
    ]


def fake_proc(tmp: Path, titles: dict[int, bytes]) -> Path:
    for pid, title in titles.items():
        (tmp / str(pid)).mkdir(parents=True)
        (tmp / str(pid) / "cmdline").write_bytes(title)
    return tmp


def test_jobs_are_the_slurmstepds_with_a_step_not_slurmds_infinity(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        {
            191: (REC / "proc-191-cmdline.bin").read_bytes(),  # recorded: [1.batch]
            192: b"slurmstepd: [12.0]\0",
            193: b"slurmstepd: [12.extern]\0",
            194: b"slurmstepd\0infinity\0",  # cgroup v2's, not recorded here (v1 host)
            195: b"sleep\x0030\0",
        },
    )
    assert report.step_jobs(proc) == ["1", "12"]


def test_the_report_says_no_state_when_the_controller_does_not_answer(tmp_path: Path) -> None:
    def runner(argv: list[str]) -> str:
        assert argv[0] == "sinfo"  # slurmd -V and -C: the set-up unit's (slurmd drops groups)
        raise SlurmError("sinfo failed (1): Unable to contact slurm controller")

    probed = (report.version("slurm-wlm 22.05.8\n"), report.node_line("NodeName=vm CPUs=2\nUp"))
    got = report.read("n1", True, "", probed, runner,
                      fake_proc(tmp_path, {191: b"slurmstepd: [7.0]\0"}))  # fmt: skip
    assert got == SlurmReport(version="22.05.8", node_line="NodeName=vm CPUs=2", jobs=["7"],
                              cgroup=report.cgroup_version())  # fmt: skip


def test_cgroups_are_v2_only_where_the_unified_hierarchy_is_the_root(tmp_path: Path) -> None:
    (tmp_path / "unified").mkdir()  # hybrid, as this build host: v2 beside v1, not the root
    (tmp_path / "unified" / "cgroup.controllers").write_text("cpu memory\n")
    assert report.cgroup_version(tmp_path) == "v1"
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    assert report.cgroup_version(tmp_path) == "v2"


class Units:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def start(self, name: str) -> str:
        self.calls.append(("start", name))
        return "done"

    async def restart(self, name: str) -> str:
        self.calls.append(("restart", name))
        return "done"

    async def stop(self, name: str) -> str:
        self.calls.append(("stop", name))
        return "done"

    async def reload(self) -> None:
        self.calls.append(("reload", ""))


async def in_process(order: setup.Order) -> setup.Done:
    """The set-up unit's work done here (the unit itself: integration/test_slurm.py)."""
    return await asyncio.to_thread(setup.carry_out, order)


# The keeper, its units, and what it told the firewall: (Slurm on, its peers) each time.
Made = tuple[keeper.Keeper, Units, list[tuple[bool, list[str]]]]


@pytest.fixture
def made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Made:
    monkeypatch.setattr(lending, "keep", lambda lent: [])
    monkeypatch.setattr(install, "missing", lambda part: [])
    monkeypatch.setattr(setup, "run", lambda argv: "")  # slurmd -V, -C: not asked here
    monkeypatch.setattr(
        report, "read", lambda node, slurmd, message, probed, proc: SlurmReport(message=message)
    )
    paths = keeper.Paths(
        units=tmp_path / "run", etc=tmp_path / "etc", munge_key=tmp_path / "munge.key",
        state=tmp_path / "lib", record=tmp_path / "agent" / "slurm-files.json",
    )  # fmt: skip
    units, fw = Units(), list[tuple[bool, list[str]]]()
    k = keeper.Keeper("n1", units, lambda on, peers: fw.append((on, list(peers))),
                      in_process, paths)  # fmt: skip
    return k, units, fw


async def test_the_part_is_started_from_drop_ins_and_restarted_on_a_new_conf(
    made: Made, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    k, units, fw = made
    await k.step()
    assert units.calls == []  # no Desired yet: nothing started nor stopped
    k.set(PART)
    await k.step()
    assert units.calls == [
        ("restart", "munge.service"), ("reload", ""),
        ("restart", "slurmctld.service"), ("restart", "slurmd.service"),
    ]  # fmt: skip
    slurmd = (tmp_path / "run/slurmd.service.d/50-llmgw.conf").read_text()
    assert "--conf-server 10.0.0.9:6817 -N n1" in slurmd
    assert (tmp_path / "etc/slurm.conf").read_text() == PART.slurm_conf
    assert fw == [(True, PART.peers)] and k.report == SlurmReport()
    units.calls.clear()
    await k.step()  # nothing changed: only started (a no-op for a running unit)
    assert units.calls == [
        ("start", "munge.service"),
        ("start", "slurmctld.service"),
        ("start", "slurmd.service"),
    ]
    units.calls.clear()
    k.set(msgspec.structs.replace(PART, lent=[]))  # lending sets nothing up again
    real = setup.set_up
    monkeypatch.setattr(setup, "set_up", lambda part, where: pytest.fail("set up again"))
    await k.step()
    monkeypatch.setattr(setup, "set_up", real)
    units.calls.clear()
    k.set(msgspec.structs.replace(PART, conf_hash="h2", slurm_conf="# new\n"))
    await k.step()
    assert ("restart", "slurmd.service") in units.calls
    assert ("restart", "slurmctld.service") in units.calls


async def test_no_part_stops_what_it_ran_and_removes_only_what_it_wrote(
    made: Made, tmp_path: Path
) -> None:
    k, units, fw = made
    (tmp_path / "etc").mkdir()
    k.set(PART)
    await k.step()
    (tmp_path / "etc/cgroup.conf").write_text("# the site's own, edited\n")
    units.calls.clear()
    k.set(None)
    await k.step()
    assert units.calls == [
        ("stop", "slurmctld.service"),
        ("stop", "slurmd.service"),
        ("reload", ""),
    ]
    assert not (tmp_path / "run/slurmd.service.d").exists()
    assert not (tmp_path / "etc/slurm.conf").exists()
    assert (tmp_path / "etc/cgroup.conf").read_text() == "# the site's own, edited\n"
    assert fw == [(True, PART.peers), (False, [])] and k.report is None


def test_a_part_needs_the_packages_of_its_daemons() -> None:
    assert install.missing(PART, exists=lambda p: "munged" in p) == [
        "client",
        "slurmd",
        "slurmctld",
    ]
    assert install.commands(["slurmd"], which=lambda m: "/usr/bin/dnf" if m == "dnf" else None)[
        0
    ] == ["dnf", "install", "-y", "slurm-slurmd"]


async def test_a_missing_package_is_installed_and_said(
    made: Made, monkeypatch: pytest.MonkeyPatch
) -> None:
    k, units, _ = made
    monkeypatch.setattr(install, "missing", lambda part: ["slurmd"])
    monkeypatch.setattr(install, "commands", lambda wanted: [])
    k.set(PART)
    await k.step()
    assert k.report is not None and "slurmd not installed" in k.report.message
    assert units.calls == []
    # Not run again at once (every RETRY_S): the same failure is said meanwhile.
    monkeypatch.setattr(setup, "set_up", lambda part, where: pytest.fail("set up again"))
    await k.step()
    assert k.report is not None and "slurmd not installed" in k.report.message
