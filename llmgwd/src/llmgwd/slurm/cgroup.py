"""cgroup.conf for Slurm on cgroup v2: jobs held to their cores, memory and devices."""

from __future__ import annotations


def cgroup_conf() -> str:
    """The cgroup.conf text (slurmd reads it from the controller, configless)."""
    return "\n".join(
        [
            "# Made by llmgw: do not edit (the leader writes it again).",
            "CgroupPlugin=cgroup/v2",
            "ConstrainCores=yes",
            "ConstrainRAMSpace=yes",
            "ConstrainDevices=yes",
            "",
        ]
    )
