"""Lending nodes to Slurm and taking them back: where each node of Slurm's stands, decided
from the settings, llmgw's replicas there and the node's Slurm report (pure functions)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw.api_types import SlurmNodeView
from llmgw.wire import SlurmReport
from llmgwd.placement.reconciler import NodeFlags
from llmgwd.slurm.settings import SlurmSettings

IN_LLMGW = "in llmgw"  # the scheduler's as any node (Slurm has it drained, or none at all)
LENDING = "lending"  # lent, llmgw's replicas still there: they are started elsewhere first
LENT = "lent"  # no replica of llmgw's left: the controller keeps it up in Slurm
RECLAIMING = "reclaiming"  # taken back: cordoned in llmgw until Slurm has it drained, no job

# States in which Slurm runs nothing there now (sinfo's long and short names): a node in one
# is llmgw's only once drained too (it may come back).
DEAD = frozenset({"down", "fail", "failing", "unknown", "unk", "future", "futr", "no_respond"})


@dataclass(frozen=True, slots=True)
class Standing:
    """Where a node stands between llmgw and Slurm, and why (for people)."""

    phase: str
    why: str = ""


def base_state(state: str) -> str:
    """Slurm's state without its flags: "idle*" -> "idle", "DRAINED+RESERVED" -> "drained"."""
    return state.strip().lower().split("+")[0].rstrip("*~#!%$@^-")


def unsure(report: SlurmReport) -> str:
    """Why a node not lent may still take a Slurm job ("": Slurm has it drained and it runs
    none, llmgw's reason or an administrator's). Anything else is not known free: held."""
    if report.jobs:
        return f"{len(report.jobs)} jobs running"
    if not report.state:
        return f"Slurm does not answer there: {report.message or 'no state reported'}"
    state = report.state.strip().lower()
    base = base_state(state)
    if base == "drained" or ("drain" in state and base in DEAD):
        return ""
    if base in DEAD:
        return f"Slurm has it {report.state}, not drained"
    return f"Slurm has it {report.state}, not drained yet"


def standing(
    node: str,
    settings: SlurmSettings,
    has_replicas: bool,
    report: SlurmReport | None,
    heard: bool = True,
) -> Standing:
    """Where node stands (report: its agent's, None where it runs no Slurm of llmgw's;
    heard: it has registered since this control plane leads). A node is llmgw's only on
    evidence: Slurm off or the node not in it, its agent running no Slurm, or Slurm having
    it drained with no job. A job, a node not heard from or a Slurm that does not say (it
    does not answer, has the node down but not drained) keep a node taken back held
    (cordoned), and a lent one lent."""
    jobs = report.jobs if report is not None else []
    if not settings.enabled or node not in settings.nodes:
        if jobs:  # a job left from before: nothing of llmgw's beside it
            return Standing(RECLAIMING, f"{len(jobs)} jobs running")
        return Standing(IN_LLMGW, "Slurm is off" if not settings.enabled else "not in Slurm")
    if heard and report is None:
        return Standing(IN_LLMGW, "its agent reports no Slurm")
    if node in settings.lent:
        return Standing(LENDING, "moving replicas") if has_replicas else Standing(LENT)
    if report is None:
        return Standing(RECLAIMING, "not heard from since this control plane leads")
    why = unsure(report)
    return Standing(RECLAIMING, why) if why else Standing(IN_LLMGW)


def standings(
    settings: SlurmSettings,
    nodes: Iterable[str],
    with_replicas: set[str],
    reports: Mapping[str, SlurmReport | None],
) -> dict[str, Standing]:
    """Each node's standing (nodes: those known; with_replicas: those where llmgw has a
    replica placed or running; reports: those heard from, by name)."""
    return {
        n: standing(n, settings, n in with_replicas, reports.get(n), n in reports)
        for n in sorted(set(nodes))
    }


def held(by_node: Mapping[str, Standing]) -> dict[str, NodeFlags]:
    """The nodes Slurm holds from llmgw's scheduler: lending and lent ones drain (their
    replicas start elsewhere, then stop), reclaiming ones are cordoned (no new replica)."""
    out: dict[str, NodeFlags] = {}
    for name, s in by_node.items():
        if s.phase in (LENDING, LENT):
            out[name] = NodeFlags(cordoned=True, draining=True)
        elif s.phase == RECLAIMING:
            out[name] = NodeFlags(cordoned=True)
    return out


def lent_now(by_node: Mapping[str, Standing]) -> list[str]:
    """The nodes the controller keeps up in Slurm (SlurmPart.lent)."""
    return sorted(n for n, s in by_node.items() if s.phase == LENT)


def node_status(name: str, s: Standing, report: SlurmReport | None) -> SlurmNodeView:
    """How a node stands, for people (GET /api/v1/slurm shows it)."""
    r = report or SlurmReport()
    status = f"{s.phase}: {s.why}" if s.why and s.phase != IN_LLMGW else s.phase
    message = r.message or (s.why if s.phase == IN_LLMGW else "")
    return SlurmNodeView(
        name=name,
        status=status,
        held=s.phase != IN_LLMGW,
        state=r.state,
        reason=r.reason,
        jobs=list(r.jobs),
        version=r.version,
        message=message,
    )
