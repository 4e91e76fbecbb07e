"""/api/v1's nodes: as the cluster state reports them, their flags, their removal."""

from __future__ import annotations

import msgspec

from llmgw import wire


class NodeFlagsView(msgspec.Struct, kw_only=True):
    """POST /nodes/{name}/cordon|drain|uncordon: what the node's flags are now."""

    name: str
    cordoned: bool
    draining: bool


# GET /nodes, DELETE /nodes/{name}: the nodes as the cluster state reports them.
class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    """One node as the cluster state knows it (the GET /nodes item)."""

    name: str
    address: str
    connected: bool
    last_seen: float  # unix time of its last message
    cores: int
    memory_bytes: int
    replicas: list[wire.ReplicaStatus] = []
    version: str = ""  # the agent's
    cordoned: bool = False  # takes no new replicas
    draining: bool = False  # its replicas are being moved off
    gpus: int = 0  # its cards
    cuda_toolkit: str = ""  # nvcc's version ("12.4"); "": none (llama.cpp on CPUs only)
    engines: list[str] = []  # "llama.cpp:cpu", "vllm:gpu", ...: what it runs where
    note: str = ""  # what people should know of it
    firewall: str = ""  # its nftables table: "ok", or why not set
    # Its cards as its agent last reported them: memory, busy share, power against its limit,
    # GPM's counters where read, and a MIG card's instances.
    cards: list[wire.Gpu] = []
    # The filesystems its agent last reported (its state directory's and /'s), each once.
    disks: list[wire.Disk] = []


class NodeRemoved(msgspec.Struct, kw_only=True):
    """DELETE /nodes/{name}: the name revoked, and whether a node of it was known here."""

    name: str
    removed: bool
    known: bool
