"""What the agent reports of its node's Slurm, read from Slurm's own commands' output."""

from __future__ import annotations

import re

_VERSION_RE = re.compile(r"slurm(?:-wlm)?\s+(\d+\.\d+\.\d+)")


def version(slurmd_v: str) -> str:
    """The version from `slurmd -V` ("slurm-wlm 22.05.8" -> "22.05.8"); "" if none."""
    m = _VERSION_RE.search(slurmd_v)
    return m.group(1) if m else ""


def node_line(slurmd_c: str) -> str:
    """`slurmd -C`'s NodeName line; "" if none."""
    return next((x for x in slurmd_c.splitlines() if x.startswith("NodeName=")), "")


def jobs(squeue: str) -> list[str]:
    """Job ids from `squeue -h -w NODE -t RUNNING -o %A` (one a line). slurmd's own
    `slurmstepd infinity` is no job and squeue never lists it."""
    return [x.strip() for x in squeue.splitlines() if x.strip()]
