"""A configless slurm.conf: the controller serves it to every slurmd; the nodes come from each
node's `slurmd -C` line and its GPUs, and a node not lent to Slurm is drained there."""

from __future__ import annotations

import msgspec

from llmgw.wire import SLURM_NOT_LENT
from llmgwd.slurm.settings import SlurmSettings

# What of `slurmd -C`'s line describes the machine (its NodeName is the host's, not ours).
HARDWARE = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
NOT_LENT = SLURM_NOT_LENT
SRUN_PORTS = "60001-63000"


class SlurmNode(msgspec.Struct, frozen=True):
    """A node as slurm.conf lists it (kept in the store, so a new leader lists it the same)."""

    name: str  # llmgw's node name, slurmd's -N
    address: str  # where slurmctld reaches its slurmd
    line: str  # its `slurmd -C` first line
    gpus: int = 0


def hardware(line: str) -> list[str]:
    """The KEY=VALUE words of a `slurmd -C` line that describe the machine, in Slurm's order;
    ValueError if it is not such a line."""
    words = dict(w.partition("=")[::2] for w in line.split() if "=" in w)
    if "NodeName" not in words or "CPUs" not in words:
        raise ValueError(f"not a slurmd -C line: {line[:120]!r}")
    return [f"{k}={words[k]}" for k in HARDWARE if k in words]


def node_line(node: SlurmNode, lent: bool) -> str:
    """The NodeName line of a node; one not lent is drained (a new node enters drained)."""
    words = [f"NodeName={node.name}", f"NodeAddr={node.address}", *hardware(node.line)]
    if node.gpus:
        words.append(f"Gres=gpu:{node.gpus}")
    if not lent:
        words += ["State=DRAIN", f'Reason="{NOT_LENT}"']
    return " ".join(words)


def _header(settings: SlurmSettings, controller_address: str, gpus: bool) -> list[str]:
    return [
        "# Made by llmgw: do not edit (the leader writes it again).",
        f"ClusterName={settings.cluster_name}",
        f"SlurmctldHost={settings.controller}({controller_address})",
        "SlurmctldParameters=enable_configless",
        "AuthType=auth/munge",
        "SlurmUser=slurm",
        "StateSaveLocation=/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup,task/affinity",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "SchedulerType=sched/backfill",
        "MpiDefault=none",
        "MailProg=/bin/true",  # Debian ships no mail program: slurmctld says so otherwise
        "ReturnToService=2",
        f"SrunPortRange={SRUN_PORTS}",
        *(["GresTypes=gpu"] if gpus else []),
    ]


def slurm_conf(settings: SlurmSettings, controller_address: str, nodes: list[SlurmNode]) -> str:
    """The slurm.conf text: the nodes in name order, all in settings.partition."""
    nodes = sorted(nodes, key=lambda n: n.name)
    lines = _header(settings, controller_address, any(n.gpus for n in nodes))
    lines += [node_line(n, n.name in settings.lent) for n in nodes]
    if nodes:
        names = ",".join(n.name for n in nodes)
        part = f"PartitionName={settings.partition} Nodes={names}"
        lines.append(f"{part} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"
