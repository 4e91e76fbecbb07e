"""munge and Slurm from the distribution when a node is given a part: one bounded background
job at a time, its output to the log, its failure said (never a reason to stop engines)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable

from llmgw.wire import SlurmPart

log = logging.getLogger(__name__)

INSTALL_S = 1200.0  # the longest an install may take
RETRY_S = 300.0  # a failed install is tried again after this
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


class Installer:
    """Runs one install at a time in the background; status says how the last one went."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._failed_at = 0.0
        self.status = ""  # "": none failed; else why, for SlurmReport.message

    def ensure(self, wanted: list[str]) -> str:
        """Start installing wanted unless an install runs or failed lately; what to report."""
        if self._task is not None and not self._task.done():
            return f"installing {', '.join(wanted)}"
        if self.status and time.monotonic() - self._failed_at < RETRY_S:
            return self.status
        argvs = commands(wanted)
        if not argvs:
            return f"{', '.join(wanted)} not installed, and no apt-get or dnf to install them"
        self._task = asyncio.create_task(self._install(argvs))
        return f"installing {', '.join(wanted)}"

    async def _install(self, argvs: list[list[str]]) -> None:
        self.status = ""
        try:
            for argv in argvs:
                await asyncio.wait_for(_run_logged(argv), INSTALL_S)
        except (OSError, RuntimeError, TimeoutError) as e:
            why = str(e) or f"ran past {INSTALL_S:.0f} s"
            self.status = f"installing Slurm failed: {why}"
            self._failed_at = time.monotonic()
            log.warning("%s", self.status)


async def _run_logged(argv: list[str]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        async for raw in proc.stdout:
            log.info("%s: %s", argv[0], raw.decode(errors="replace").rstrip())
        code = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if code != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} exited with status {code}")
