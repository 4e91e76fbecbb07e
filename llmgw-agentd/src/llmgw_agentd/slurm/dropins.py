"""The drop-ins that run Debian's packaged slurmd and slurmctld as llmgw's leader says: slurmd
configless from the controller (--conf-server), both restarted while they fail (a slurmd the
controller does not know yet exits)."""

from __future__ import annotations

import shlex
from pathlib import Path

from llmgw.wire import SlurmPart

RUN_UNITS = Path("/run/systemd/system")  # runtime drop-ins: gone at boot, made again by us
DROPIN = "50-llmgw.conf"
SLURMD = "slurmd.service"
SLURMCTLD = "slurmctld.service"
SLURM_ETC = Path("/etc/slurm")


def dropin_path(unit: str, root: Path = RUN_UNITS) -> Path:
    """Where the agent's drop-in of unit is."""
    return root / f"{unit}.d" / DROPIN


def _text(argv: list[str], clear_condition: bool, conf_hash: str) -> str:
    unit = ["[Unit]", "ConditionPathExists="] if clear_condition else []
    return "\n".join(
        [
            "# Made by llmgw-agentd: removed when the node has no part in Slurm.",
            # A new slurm.conf changes the drop-in, and the agent restarts a unit whose
            # drop-in changed (22.05's slurmd needs it for a new node list).
            f"# slurm.conf {conf_hash}",
            *unit,
            "[Service]",
            # Slurm 23.02 and later package Type=notify units, which want --systemd; in the
            # foreground (-D) as Type=simple every version starts alike (22.05's is simple).
            "Type=simple",
            "ExecStart=",
            f"ExecStart={shlex.join(argv)}",
            "Restart=always",
            "RestartSec=5",
            "",
        ]
    )


def slurmd_dropin(part: SlurmPart, node: str) -> str:
    """slurmd's drop-in: configless from the controller, as llmgw's node name (the packaged
    unit wants /etc/slurm/slurm.conf, which a configless node has not: that condition goes)."""
    argv = ["/usr/sbin/slurmd", "-D", "-s", "--conf-server", part.conf_server, "-N", node]
    return _text(argv, True, part.conf_hash)


def slurmctld_dropin(part: SlurmPart) -> str:
    """slurmctld's drop-in: on the files the agent wrote under /etc/slurm, restarted if it
    ends."""
    argv = ["/usr/sbin/slurmctld", "-D", "-s", "-f", str(SLURM_ETC / "slurm.conf")]
    return _text(argv, False, part.conf_hash)


def wanted(part: SlurmPart | None, node: str) -> dict[str, str]:
    """unit -> its drop-in text, for this part (none: no drop-in)."""
    out: dict[str, str] = {}
    if part is not None and part.slurmctld:
        out[SLURMCTLD] = slurmctld_dropin(part)
    if part is not None and part.slurmd:
        out[SLURMD] = slurmd_dropin(part, node)
    return out


def controller_files(part: SlurmPart) -> dict[str, str]:
    """The controller's files under /etc/slurm: file name -> text."""
    files = {"slurm.conf": part.slurm_conf, "cgroup.conf": part.cgroup_conf}
    if part.gres_conf:
        files["gres.conf"] = part.gres_conf
    return files
