"""A restarted agent and a new leader: the agent reports the Slurm it finds before any
Desired (never as a node without Slurm), and acts on no part a control plane has not
loaded yet."""

from __future__ import annotations

from pathlib import Path

from llmgw.wire import SlurmReport
from llmgw_agentd.slurm import keeper
from tests.llmgw_agentd.slurm.test_slurm_keeper import (  # noqa: F401 (made: the fixture)
    PART,
    Made,
    Units,
    fake_proc,
    in_process,
    made,
)


def _restarted(paths: keeper.Paths, proc: Path) -> tuple[keeper.Keeper, Units]:
    """The keeper of an agent started again on the same node."""
    units = Units()
    paths = keeper.Paths(paths.units, paths.etc, paths.munge_key, paths.state, paths.record,
                         proc)  # fmt: skip
    return keeper.Keeper("n1", units, lambda on, peers: None, in_process, paths), units


async def test_a_restarted_agent_reports_its_slurm_and_jobs_before_any_desired(
    made: Made,  # noqa: F811
    tmp_path: Path,
) -> None:
    k, _, _ = made
    k.set(PART)
    await k.step()  # slurmd and slurmctld run from llmgw's drop-ins

    # Killed -9 and started again by systemd, while job 41 runs there.
    again, units = _restarted(k.paths, fake_proc(tmp_path / "proc", {
        200: b"slurmstepd: [41.batch]\0", 201: b"slurmd\0-D\0"}))  # fmt: skip
    await again.look()

    assert again.report is not None and again.report.jobs == ["41"]
    assert again.report.state == ""  # not known yet: the leader holds the node
    await again.step()
    assert units.calls == []  # no Desired yet: nothing started nor stopped


async def test_an_agent_with_no_slurm_of_llmgws_reports_none(tmp_path: Path) -> None:
    paths = keeper.Paths(units=tmp_path / "run", record=tmp_path / "agent" / "files.json")
    fresh, _ = _restarted(paths, fake_proc(tmp_path / "proc", {300: b"sshd\0"}))

    await fresh.look()

    assert fresh.report is None


async def test_a_job_alone_is_reported_without_llmgws_units(tmp_path: Path) -> None:
    paths = keeper.Paths(units=tmp_path / "run", record=tmp_path / "agent" / "files.json")
    proc = fake_proc(tmp_path / "proc", {300: b"slurmstepd: [9.0]\0"})
    fresh, _ = _restarted(paths, proc)

    await fresh.look()

    assert fresh.report == SlurmReport(
        jobs=["9"], message=fresh.report.message if fresh.report else ""
    )
