"""/api/v1's status: the cluster at a glance."""

from __future__ import annotations

import msgspec


# GET /status: the cluster at a glance.
class NodeCounts(msgspec.Struct, kw_only=True):
    """The nodes known, and those connected now."""

    total: int
    connected: int


class ModelCounts(msgspec.Struct, kw_only=True):
    """The models of the catalog, and those with replicas wanted."""

    total: int
    served: int


class ReplicaCounts(msgspec.Struct, kw_only=True):
    """The replicas wanted, and those ready."""

    wanted: int
    ready: int


class StatusView(msgspec.Struct, kw_only=True):
    """GET /status"""

    name: str
    version: str  # llmgwd's
    uptime_s: float
    join_url: str
    nodes: NodeCounts
    models: ModelCounts
    replicas: ReplicaCounts
