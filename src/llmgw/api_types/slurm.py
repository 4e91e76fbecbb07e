"""/api/v1's Slurm: its settings and each node's standing between llmgw and Slurm."""

from __future__ import annotations

import msgspec


# GET /slurm, PUT /slurm, POST /slurm/nodes/{name}/lend|reclaim
class SlurmNodeView(msgspec.Struct, frozen=True, kw_only=True):
    """A node of Slurm's: where it stands between llmgw and Slurm."""

    name: str
    status: str  # "lent", "lending: ...", "reclaiming: N jobs running", "in llmgw"
    held: bool  # Slurm holds it from llmgw's scheduler (cordoned or draining there)
    state: str = ""  # Slurm's state of it, as its agent reports it ("": none reported)
    reason: str = ""  # why Slurm has it drained or down
    jobs: list[str] = []
    version: str = ""  # Slurm's
    message: str = ""  # what failed last on the node, or why it is not held


class SlurmView(msgspec.Struct, frozen=True, kw_only=True):
    """Slurm's settings, and each node's standing as the leader sees it (None: asked of a
    standby, which knows none: ask the leader)."""

    enabled: bool = False
    cluster_name: str = "llmgw"
    controller: str = ""  # the node that runs slurmctld
    nodes: list[str] = []  # the nodes in Slurm (slurmd runs there)
    lent: list[str] = []  # the nodes of those lent to Slurm; the others are drained there
    partition: str = "llmgw"
    # A new leader that finds no kept node list holds its Slurm decisions this many seconds
    # while the nodes report (or until all have), so slurm.conf drops no node with a job.
    hold_for_s: int = 120
    # Every node of the cluster runs slurmd, those that join later too (nodes: as well).
    all_nodes: bool = False
    status: list[SlurmNodeView] | None = None


class SlurmSettingsIn(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A change of Slurm's settings: the fields given replace the stored ones."""

    enabled: bool | msgspec.UnsetType = msgspec.UNSET
    cluster_name: str | msgspec.UnsetType = msgspec.UNSET
    controller: str | msgspec.UnsetType = msgspec.UNSET
    nodes: list[str] | msgspec.UnsetType = msgspec.UNSET
    lent: list[str] | msgspec.UnsetType = msgspec.UNSET
    partition: str | msgspec.UnsetType = msgspec.UNSET
    hold_for_s: int | msgspec.UnsetType = msgspec.UNSET
    all_nodes: bool | msgspec.UnsetType = msgspec.UNSET
