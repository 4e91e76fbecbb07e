"""This checkout's .deb packages, built by scripts/build-packages, for the modules that
install them (test_packages, test_upgrade): once per session (integration/conftest.py's
tree_debs), then at other versions as a module needs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from integration.harness import REPO

PACKAGES = ("llmgw", "llmgwd", "llmgw-agentd")
APT = {"DEBIAN_FRONTEND": "noninteractive"}


def build_tools() -> str | None:
    """Why the .debs cannot be built here (after trying to install what is missing)."""
    if shutil.which("uv") is None:
        return "uv is not on PATH (python3 -m pip install uv)"
    missing = [t for t in ("dpkg-buildpackage", "dh") if shutil.which(t) is None]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "debhelper", "dpkg-dev"],
            capture_output=True, env={**os.environ, **APT}, timeout=600, check=False,
        )  # fmt: skip
        missing = [t for t in missing if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)} (apt-get install debhelper dpkg-dev)"
    return None


def build(out: Path, version: str | None = None, lint: bool = False) -> list[Path]:
    """scripts/build-packages --deb into out; the three .debs it made."""
    cmd = [str(REPO / "scripts/build-packages"), "--deb", "--out", str(out)]
    cmd += ["--version", version] if version else []
    cmd += [] if lint and shutil.which("lintian") else ["--no-lint"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, f"build-packages failed:\n{r.stderr[-4000:]}"
    debs = sorted(Path(p) for p in r.stdout.split() if p.endswith(".deb"))
    assert {p.name.split("_")[0] for p in debs} == set(PACKAGES), r.stdout
    return debs


def deb_version(deb: Path) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True, check=True
    ).stdout.strip()
