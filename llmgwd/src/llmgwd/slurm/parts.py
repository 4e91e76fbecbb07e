"""Each node's part in Slurm (wire.SlurmPart), made by the leader from the settings, what is
kept and what the nodes report (pure functions)."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from llmgw.wire import Inventory, SlurmPart
from llmgwd.slurm.cgroup import cgroup_conf
from llmgwd.slurm.conf import SlurmNode, hardware, slurm_conf
from llmgwd.slurm.gres import gpu_count, gres_conf
from llmgwd.slurm.kept import Kept
from llmgwd.slurm.munge import munge_key
from llmgwd.slurm.settings import SlurmSettings

SLURMCTLD_PORT = 6817


@dataclass(frozen=True, slots=True)
class Seen:
    """A node as the leader sees it now: where it is reached and what it reports."""

    address: str
    inventory: Inventory


def conf_server(address: str) -> str:
    """slurmd's --conf-server for a controller at address ("HOST:6817", IPv6 in brackets)."""
    try:
        host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        host = address  # a DNS name
    return f"{host}:{SLURMCTLD_PORT}"


def reported(settings: SlurmSettings, seen: Mapping[str, Seen]) -> dict[str, SlurmNode]:
    """The nodes of Slurm's that reported a `slurmd -C` line, as slurm.conf lists them."""
    out: dict[str, SlurmNode] = {}
    for name in settings.nodes:
        node = seen.get(name)
        report = node.inventory.slurm if node is not None else None
        if node is None or report is None or not report.node_line:
            continue
        try:
            hardware(report.node_line)
        except ValueError:
            continue  # not a line slurm.conf can take: the node is listed once it sends one
        gpus = gpu_count(node.inventory)
        out[name] = SlurmNode(name, node.address, report.node_line, gpus, report.cgroup)
    return out


def busy(kept: Kept, seen: Mapping[str, Seen]) -> set[str]:
    """The listed nodes that may have a job: those reporting one, and those not heard from
    (a new leader knows nothing of them until they report)."""
    out = set()
    for n in kept.nodes:
        node = seen.get(n.name)
        report = node.inventory.slurm if node is not None else None
        if node is None or (report is not None and report.jobs):
            out.add(n.name)
    return out


def conf_hash(text: str) -> str:
    """The hash slurmd and slurmctld restart on (a new slurm.conf)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def parts(
    settings: SlurmSettings,
    kept: Kept,
    seen: Mapping[str, Seen],
    lent: list[str],
    secret: bytes,
) -> dict[str, SlurmPart | None]:
    """Each node's part, for every node seen (None: no part, its agent stops its Slurm).
    With Slurm on and no controller's address known (seen or kept), no node is told
    anything (none in the answer): "no part" would stop slurmd, and its jobs with it."""
    out: dict[str, SlurmPart | None] = dict.fromkeys(seen)
    if not settings.enabled:
        return out
    if not kept.controller_address:
        return {}
    conf = slurm_conf(settings, kept.controller_address, kept.nodes)
    listed = {n.name for n in kept.nodes}
    peers = sorted({kept.controller_address, *(n.address for n in kept.nodes)})
    common = SlurmPart(
        conf_server=conf_server(kept.controller_address),
        munge_key=base64.b64encode(munge_key(secret)).decode(),
        cluster_name=settings.cluster_name,
        conf_hash=conf_hash(conf),
        peers=peers,
    )
    for name in seen:
        slurmd = name in settings.nodes or name in listed
        if name != settings.controller:
            out[name] = _replace(common, slurmd=True) if slurmd else None
            continue
        inventories = {n: seen[n].inventory for n in sorted(listed) if n in seen}
        out[name] = _replace(
            common,
            slurmd=slurmd,
            slurmctld=True,
            slurm_conf=conf,
            gres_conf=gres_conf(inventories),
            cgroup_conf=cgroup_conf(all(n.cgroup != "v1" for n in kept.nodes)),
            lent=list(lent),
        )
    return out


def _replace(part: SlurmPart, **fields: object) -> SlurmPart:
    return msgspec.structs.replace(part, **fields)
