"""scripts/gpu-check where there is no GPU (this machine): it stops at once and says why."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "gpu-check"


def run(tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{tmp}:/usr/bin:/bin", "OUT": str(tmp / "out"), "HOME": str(tmp)}
    return subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)


def test_its_syntax_is_sound() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0


def test_without_nvidia_smi_it_fails_at_once_saying_so(tmp_path: Path) -> None:
    out = run(tmp_path)
    assert out.returncode == 1
    assert "no nvidia-smi here: this check needs a machine with an NVIDIA GPU" in out.stderr
    assert not (tmp_path / "out").exists()  # nothing recorded, built or booted


def test_with_a_driver_but_no_card_it_fails_at_once_saying_so(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'No devices were found'; exit 6\n")
    smi.chmod(0o755)
    out = run(tmp_path)
    assert out.returncode == 1 and "nvidia-smi answers no cards" in out.stderr
