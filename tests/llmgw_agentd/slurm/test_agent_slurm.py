"""The agent's part in Slurm: its drop-ins for Debian's units, munge's key, what it reads back."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from llmgw.wire import SlurmPart
from llmgw_agentd.slurm import dropins, munge, report

PART = SlurmPart(slurmd=True, conf_server="10.0.0.9:6817", munge_key="", cluster_name="llmgw")
RECORDED = Path(__file__).parents[2] / "llmgwd" / "slurm" / "recorded" / "slurmd-C.txt"


def test_slurmd_runs_configless_from_the_controller_as_our_node_name() -> None:
    text = dropins.slurmd_dropin(PART, "n1")
    lines = text.splitlines()
    assert "ExecStart=" in lines  # the packaged command is cleared first
    assert "ExecStart=/usr/sbin/slurmd -D -s --conf-server 10.0.0.9:6817 -N n1" in lines
    assert "ConditionPathExists=" in lines  # no /etc/slurm/slurm.conf on a configless node
    assert "Type=simple" in lines  # a packaged Type=notify unit (Slurm 23.02+) would want --systemd
    assert "Restart=always" in lines


def test_no_part_wants_no_dropin_and_the_controller_gets_both() -> None:
    assert dropins.wanted(None, "n1") == {}
    both = dropins.wanted(SlurmPart(slurmd=True, slurmctld=True, conf_server="h:6817"), "cp")
    assert set(both) == {"slurmd.service", "slurmctld.service"}
    assert dropins.dropin_path("slurmd.service") == Path(
        "/run/systemd/system/slurmd.service.d/50-llmgw.conf"
    )


def test_the_munge_key_is_written_once_and_only_root_or_munge_reads_it(tmp_path: Path) -> None:
    key = os.urandom(1024)
    path = tmp_path / "munge.key"

    assert munge.write_key(base64.b64encode(key).decode(), path, owner="no-such-user")
    assert not munge.write_key(base64.b64encode(key).decode(), path, owner="no-such-user")

    assert path.read_bytes() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    with pytest.raises(ValueError, match="shorter"):
        munge.write_key(base64.b64encode(b"x" * 8).decode(), path)


def test_the_report_reads_slurms_own_output() -> None:
    assert report.version("slurm-wlm 22.05.8\n") == "22.05.8"
    assert report.version("bash: slurmd: not found") == ""
    assert report.node_line(RECORDED.read_text()).startswith("NodeName=")
    assert report.jobs("12\n 13\n\n") == ["12", "13"]
