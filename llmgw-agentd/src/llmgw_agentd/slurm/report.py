"""What the agent reports of its node's Slurm, read from Slurm's own commands' output."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from llmgw.wire import SlurmReport
from llmgw_agentd.slurm import lending
from llmgw_agentd.slurm.cmd import SlurmError, run

# The title a job step's slurmstepd gives itself: "slurmstepd: [123.batch]", "[123.0]",
# "[123.extern]"; slurmd's own "slurmstepd infinity" (cgroup v2) is none.
_STEP_RE = re.compile(r"^slurmstepd: \[(\d+)(?:_\d+)?\.[\w]+\]")
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


def cgroup_version(root: Path = Path("/sys/fs/cgroup")) -> str:
    """ "v2" where the unified hierarchy is mounted at root, else "v1" (v1 or hybrid)."""
    return "v2" if (root / "cgroup.controllers").exists() else "v1"


def step_jobs(proc: Path = Path("/proc")) -> list[str]:
    """The jobs with a step running on this node, from its slurmstepds' titles: read here,
    so it holds while the controller does not answer."""
    found: set[str] = set()
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            title = cmdline.read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue  # ended meanwhile
        m = _STEP_RE.match(title)
        if m:
            found.add(m.group(1))
    return sorted(found, key=int)


def read(
    node: str,
    slurmd: bool,
    message: str,
    probed: tuple[str, str] = ("", ""),
    runner: Callable[[list[str]], str] = run,
    proc: Path = Path("/proc"),
) -> SlurmReport:
    """The node's Slurm as it is now, with the version and `slurmd -C` line its set-up
    probed (slurmd wants privileges the agent's unit has not); state and reason "" when the
    controller does not answer, or the node runs no slurmd."""
    ver, line = probed
    state = reason = ""
    if slurmd and ver:
        try:
            found = lending.nodes(runner(["sinfo", "-h", "-N", "-n", node, "-o", "%N|%T|%E"]))
            state, reason = found.get(node, ("", ""))
        except SlurmError:
            pass  # the controller does not answer: the state is not known
    return SlurmReport(
        version=ver, node_line=line, state=state, jobs=step_jobs(proc), message=message,
        reason=reason, cgroup=cgroup_version(),
    )  # fmt: skip
