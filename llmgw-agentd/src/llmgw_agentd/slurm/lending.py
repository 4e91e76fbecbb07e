"""The controller keeps each node's drain in Slurm as llmgw lends it: a node lent that llmgw
drained is resumed, a node not lent is drained with llmgw's reason, and a drain with any other
reason (a Slurm administrator's) is never lifted nor overwritten."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmgw.wire import SLURM_NOT_LENT
from llmgw_agentd.slurm.cmd import run

SINFO = ["sinfo", "-h", "-N", "-o", "%N|%T|%E"]


def nodes(sinfo: str) -> dict[str, tuple[str, str]]:
    """Node -> (state, reason) from SINFO's output ("n1|drained|llmgw: not lent to Slurm");
    a reason of "none" is ""."""
    out: dict[str, tuple[str, str]] = {}
    for line in sinfo.splitlines():
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        if name.strip() and state:
            out[name.strip()] = (state.strip(), "" if reason.strip() == "none" else reason.strip())
    return out


def actions(found: dict[str, tuple[str, str]], lent: Sequence[str]) -> list[tuple[str, str]]:
    """(node, "resume" or "drain") to do, by node name."""
    todo: list[tuple[str, str]] = []
    for name, (state, reason) in sorted(found.items()):
        drained = "drain" in state
        if name in lent:
            # One not responding ("drained*") cannot be resumed yet: Slurm refuses it.
            if drained and reason == SLURM_NOT_LENT and not state.endswith("*"):
                todo.append((name, "resume"))
        elif not drained:
            todo.append((name, "drain"))
    return todo


def keep(lent: Sequence[str], runner: Callable[[list[str]], str] = run) -> list[tuple[str, str]]:
    """Read the nodes from sinfo and resume or drain them; what was done (SlurmError if a
    command failed)."""
    todo = actions(nodes(runner(SINFO)), lent)
    for name, what in todo:
        argv = ["scontrol", "update", f"NodeName={name}", f"State={what.upper()}"]
        if what == "drain":
            argv.append(f"Reason={SLURM_NOT_LENT}")
        runner(argv)
    return todo
