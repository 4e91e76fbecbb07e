"""A configless slurm.conf: the controller serves it to every slurmd; the nodes come from each
node's `slurmd -C` line and its GPUs. Every node enters drained; the controller's agent
resumes the lent ones (SlurmPart.lent), so lending changes no file and restarts no daemon."""

from __future__ import annotations

import msgspec

from llmgw.wire import SLURM_NOT_LENT
from llmgwd.slurm.settings import SlurmSettings

# What of `slurmd -C`'s line describes the machine (its NodeName is the host's, not ours).
HARDWARE = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
NOT_LENT = SLURM_NOT_LENT
SRUN_PORTS = "60001-63000"
BF_INTERVAL_S = 10  # backfill's pass, seconds (Slurm's default: 30)


class SlurmNode(msgspec.Struct, frozen=True):
    """A node as slurm.conf lists it (kept in the store, so a new leader lists it the same)."""

    name: str  # llmgw's node name, slurmd's -N
    address: str  # where slurmctld reaches its slurmd
    line: str  # its `slurmd -C` first line
    gpus: int = 0
    cgroup: str = ""  # SlurmReport.cgroup: "v1" where jobs cannot be held in cgroups


def hardware(line: str) -> list[str]:
    """The KEY=VALUE words of a `slurmd -C` line that describe the machine, in Slurm's order;
    ValueError if it is not such a line."""
    words = dict(w.partition("=")[::2] for w in line.split() if "=" in w)
    if "NodeName" not in words or "CPUs" not in words:
        raise ValueError(f"not a slurmd -C line: {line[:120]!r}")
    return [f"{k}={words[k]}" for k in HARDWARE if k in words]


def node_line(node: SlurmNode) -> str:
    """The NodeName line of a node, drained (a new node enters drained, until lent)."""
    words = [f"NodeName={node.name}", f"NodeAddr={node.address}", *hardware(node.line)]
    if node.gpus:
        words.append(f"Gres=gpu:{node.gpus}")
    words += ["State=DRAIN", f'Reason="{NOT_LENT}"']
    return " ".join(words)


def mem_per_cpu(nodes: list[SlurmNode]) -> int:
    """DefMemPerCPU: the smallest node's memory per CPU (MiB), so that a job that asks for
    no memory is not given all of a node's (CR_Core_Memory) and others can run beside it."""
    per_cpu = []
    for n in nodes:
        words = dict(w.split("=", 1) for w in hardware(n.line))
        if int(words.get("CPUs", "0")) > 0 and "RealMemory" in words:
            per_cpu.append(int(words["RealMemory"]) // int(words["CPUs"]))
    return max(1, min(per_cpu)) if per_cpu else 0


def tracking(nodes: list[SlurmNode]) -> list[str]:
    """How jobs are tracked and held: in cgroups (v2), unless a node's cgroups are v1 or
    hybrid, where Slurm 22.05 refuses cgroup/v2: there by /proc, without containment."""
    if any(n.cgroup == "v1" for n in nodes):
        return ["ProctrackType=proctrack/linuxproc", "TaskPlugin=task/affinity"]
    return ["ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup,task/affinity"]


def _header(settings: SlurmSettings, controller_address: str, nodes: list[SlurmNode]) -> list[str]:
    mem = mem_per_cpu(nodes)
    return [
        "# Made by llmgw: do not edit (the leader writes it again).",
        f"ClusterName={settings.cluster_name}",
        f"SlurmctldHost={settings.controller}({controller_address})",
        "SlurmctldParameters=enable_configless",
        "AuthType=auth/munge",
        "SlurmUser=slurm",
        "StateSaveLocation=/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        *tracking(nodes),
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        *([f"DefMemPerCPU={mem}"] if mem else []),
        "SchedulerType=sched/backfill",
        # Without accounting storage, 23.11's main scheduler can leave a batch job pending
        # InvalidAccount; backfill starts it on its next pass: every 10 s, not 30.
        f"SchedulerParameters=bf_interval={BF_INTERVAL_S}",
        "MpiDefault=none",
        "MailProg=/bin/true",  # Debian ships no mail program: slurmctld says so otherwise
        "ReturnToService=2",
        f"SrunPortRange={SRUN_PORTS}",
        *(["GresTypes=gpu"] if any(n.gpus for n in nodes) else []),
    ]


def slurm_conf(settings: SlurmSettings, controller_address: str, nodes: list[SlurmNode]) -> str:
    """The slurm.conf text: the nodes in name order, all in settings.partition."""
    nodes = sorted(nodes, key=lambda n: n.name)
    lines = _header(settings, controller_address, nodes)
    lines += [node_line(n) for n in nodes]
    if nodes:
        names = ",".join(n.name for n in nodes)
        part = f"PartitionName={settings.partition} Nodes={names}"
        lines.append(f"{part} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"
