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


class TrafficView(msgspec.Struct, kw_only=True):
    """This control plane's own /v1 requests, per second: not the cluster's (each control
    plane counts the requests it answers), over the window_s seconds before the read (the
    last minute, or since the read before it, or llmgwd's start, where that is longer ago)."""

    scope: str  # "this control plane": the figures of the plane answering, no other's
    plane: str  # its name
    window_s: float  # the seconds the figures cover (0: none yet)
    requests_per_s: float
    errors_4xx_per_s: float
    errors_5xx_per_s: float


class StatusView(msgspec.Struct, kw_only=True):
    """GET /status"""

    name: str
    version: str  # llmgwd's
    uptime_s: float
    join_url: str
    nodes: NodeCounts
    models: ModelCounts
    replicas: ReplicaCounts
    # None: this llmgwd does not count /v1's requests (client.request_metrics = false)
    traffic: TrafficView | None = None
    ca_fingerprint: str = ""  # the cluster CA's sha256: `llmgw context add --ca-fingerprint`
    mode: str = "cluster"  # server.yaml's mode: cluster, or mirror (the model mirror alone)
