"""What munge and Slurm a node's part needs from the distribution, and the commands that
install it (run by the set-up unit, slurm/setup.py, bounded by INSTALL_S)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

from llmgw.wire import SlurmPart

INSTALL_S = 1200.0  # the longest an install may take
# What each part needs: the file that says it is installed, and the package by manager.
NEEDS = {
    "munge": ("/usr/sbin/munged", {"apt-get": "munge", "dnf": "munge"}),
    "slurmd": ("/usr/sbin/slurmd", {"apt-get": "slurmd", "dnf": "slurm-slurmd"}),
    "slurmctld": ("/usr/sbin/slurmctld", {"apt-get": "slurmctld", "dnf": "slurm-slurmctld"}),
    "client": ("/usr/bin/scontrol", {"apt-get": "slurm-client", "dnf": "slurm"}),
}


def missing(part: SlurmPart, exists: Callable[[str], bool] = os.path.exists) -> list[str]:
    """The parts of NEEDS this part wants that are not installed."""
    want = ["munge", "client", *(["slurmd"] if part.slurmd else [])]
    want += ["slurmctld"] if part.slurmctld else []
    return [w for w in want if not exists(NEEDS[w][0])]


def commands(
    wanted: list[str], which: Callable[[str], str | None] = shutil.which
) -> list[list[str]]:
    """The commands that install them with this system's package manager; [] if it has none
    we know."""
    for manager in ("apt-get", "dnf"):
        if which(manager):
            pkgs = [NEEDS[w][1][manager] for w in wanted]
            if manager == "apt-get":
                return [["apt-get", "update"], ["apt-get", "install", "-y", *pkgs]]
            return [["dnf", "install", "-y", *pkgs]]
    return []
