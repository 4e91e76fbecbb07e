"""The node's Slurm set-up, run outside the agent's sandbox as a transient oneshot unit: its
order is root's alone (it holds munge's key), and what it did or why it failed comes back."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest
from dbus_fast import Variant

from llmgw.wire import SlurmPart
from llmgw_agentd.slurm import install, setup
from llmgw_agentd.slurm.setup_unit import SetupUnit

KEY = base64.b64encode(b"k" * 32).decode()


class FakeSystemd:
    """Runs the unit's argv here, as systemd would run it, and says how its job ended."""

    def __init__(self) -> None:
        self.modes: list[int] = []
        self.props: dict[str, object] = {}
        self.reset: list[str] = []

    async def reset_failed(self, name: str) -> None:
        self.reset.append(name)

    async def start_transient(
        self, name: str, argv: Sequence[str], properties: Sequence[tuple[str, Variant]]
    ) -> str:
        assert name == setup.UNIT
        self.props = {k: v.value for k, v in properties}
        return await asyncio.to_thread(self._run, argv)

    def _run(self, argv: Sequence[str]) -> str:
        self.modes.append(stat.S_IMODE(Path(argv[-2]).stat().st_mode))
        # The order names tmp_path roots, so this run writes there only.
        code = subprocess.run([sys.executable, *argv[1:]], check=False).returncode
        return "done" if code == 0 else "failed"


def _where(tmp_path: Path) -> setup.Where:
    return setup.Where(
        etc=str(tmp_path / "etc"), munge_key=str(tmp_path / "munge.key"),
        state=str(tmp_path / "lib"), record=str(tmp_path / "agent/rec.json"),
    )  # fmt: skip


async def test_a_bad_order_fails_with_its_reason_and_leaves_no_order(tmp_path: Path) -> None:
    sd = FakeSystemd()
    unit = SetupUnit(sd, tmp_path / "agent")
    part = SlurmPart(slurmd=True, munge_key=base64.b64encode(b"short").decode())

    done = await unit(setup.Order(setup.SET_UP, _where(tmp_path), part))

    assert "shorter than munge's least" in done.message
    assert sd.modes == [0o600] and sd.reset == [setup.UNIT]
    assert sd.props["Type"] == "oneshot"
    assert not (tmp_path / "agent" / "slurm-setup-order.json").exists()  # the key with it
    assert not (tmp_path / "munge.key").exists()


async def test_undo_removes_only_what_a_set_up_wrote(tmp_path: Path) -> None:
    record = tmp_path / "agent/rec.json"
    record.parent.mkdir(parents=True)
    (tmp_path / "ours.conf").write_text("x\n")
    (tmp_path / "theirs.conf").write_text("edited\n")
    sha = "a" * 64  # not theirs.conf's: edited since
    ours = hashlib.sha256(b"x\n").hexdigest()
    written = {str(tmp_path / "ours.conf"): ours, str(tmp_path / "theirs.conf"): sha}
    record.write_bytes(msgspec.json.encode(written))

    done = await SetupUnit(FakeSystemd(), tmp_path / "agent")(
        setup.Order(setup.UNDO, _where(tmp_path))
    )

    assert done == setup.Done(removed=[str(tmp_path / "ours.conf")])
    assert (tmp_path / "theirs.conf").exists() and not (tmp_path / "ours.conf").exists()


def test_the_munge_key_is_written_0400_and_only_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    part = SlurmPart(slurmd=True, munge_key=KEY)
    order = setup.Order(setup.SET_UP, _where(tmp_path), part)
    answers = {"-V": "slurm-wlm 22.05.8\n", "-C": "NodeName=x CPUs=2\nUpTime=0\n"}
    monkeypatch.setattr(setup, "run", lambda argv: answers[argv[1]])
    monkeypatch.setattr(install, "missing", lambda part: [])
    first, again = setup.carry_out(order), setup.carry_out(order)
    assert (first.munge_changed, again.munge_changed) == (True, False)
    assert (first.version, first.node_line) == ("22.05.8", "NodeName=x CPUs=2")
    assert stat.S_IMODE((tmp_path / "munge.key").stat().st_mode) == 0o400
