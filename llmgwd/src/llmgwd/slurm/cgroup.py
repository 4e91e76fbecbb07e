"""cgroup.conf: jobs held to their cores, memory and devices on cgroup v2; where a node's
cgroups are v1 or hybrid (Slurm 22.05 refuses cgroup/v2 there) the plugin is autodetected and
nothing constrained, as slurm.conf then tracks jobs without cgroups (conf.tracking)."""

from __future__ import annotations


def cgroup_conf(v2: bool = True) -> str:
    """The cgroup.conf text (slurmd reads it from the controller, configless)."""
    head = ["# Made by llmgw: do not edit (the leader writes it again)."]
    if not v2:
        return "\n".join([*head, "CgroupPlugin=autodetect", ""])
    return "\n".join(
        [
            *head,
            "CgroupPlugin=cgroup/v2",
            "ConstrainCores=yes",
            "ConstrainRAMSpace=yes",
            "ConstrainDevices=yes",
            "",
        ]
    )
