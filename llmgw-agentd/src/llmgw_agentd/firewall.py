"""The node's nftables table (`inet llmgw`) as one libnftables JSON batch, made from what the
agent knows: engine ports open only to the control planes and the node itself; Slurm's ports,
when Slurm is on, only to the cluster's networks. Everything else is left alone (policy accept)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

FAMILY = "inet"
TABLE = "llmgw"
CHAIN = "input"
SLURM_PORTS = ((6817, 6818), (60001, 63000))  # slurmctld/slurmd, and srun's SrunPortRange

Json = dict[str, Any]
Addr = ipaddress.IPv4Address | ipaddress.IPv6Address | ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Wanted:
    """What the table is made from."""

    engine_ports: tuple[int, int]  # the agent's port_range
    planes: tuple[str, ...] = ()  # the control planes' IP addresses
    slurm: bool = False  # Slurm runs on this node
    networks: tuple[str, ...] = ()  # the cluster's networks ("10.0.0.0/24"), for Slurm


def ref_table() -> Json:
    """The table as libnftables' JSON names it."""
    return {"family": FAMILY, "name": TABLE}


def ruleset(w: Wanted) -> Json:
    """The batch that replaces the table whole, in one transaction (add, delete, add: it
    works whether the table is there or not); no other table is named."""
    chain = {**_ref(), "name": CHAIN, "type": "filter", "hook": "input", "prio": 0}
    cmds: list[Json] = [
        {"add": {"table": ref_table()}},
        {"delete": {"table": ref_table()}},
        {"add": {"table": ref_table()}},
        {"add": {"chain": {**chain, "policy": "accept"}}},  # it only ever drops these ports
    ]
    planes: list[Addr] = [ipaddress.ip_address(a) for a in w.planes]
    nets: list[Addr] = [ipaddress.ip_network(n, strict=False) for n in w.networks]
    if not w.slurm:
        nets = []
    for name, items in (("planes", planes), ("cluster", nets)):
        for v in (4, 6):
            cmds.append(_set(f"{name}{v}", v, [x for x in items if x.version == v]))
    rules = [_rule(_ct_established(), {"accept": None}), _rule(_iif_lo(), {"accept": None})]
    rules += _only_from([w.engine_ports], "planes")
    if w.slurm:
        rules += _only_from(list(SLURM_PORTS), "cluster")
    cmds += [{"add": {"rule": {**_ref(), "chain": CHAIN, "expr": r}}} for r in rules]
    return {"nftables": cmds}


def delete() -> Json:
    """The batch that removes the table, there or not (the package's purge runs the same)."""
    return {"nftables": [{"add": {"table": ref_table()}}, {"delete": {"table": ref_table()}}]}


def _ref() -> Json:
    return {"family": FAMILY, "table": TABLE}


def _set(name: str, version: int, items: list[Addr]) -> Json:
    kind = "ipv4_addr" if version == 4 else "ipv6_addr"
    body: Json = {**_ref(), "name": name, "type": kind, "flags": ["interval"]}
    elems = [_elem(x) for x in items]
    if elems:
        body["elem"] = elems
    return {"add": {"set": body}}


def _elem(x: object) -> Any:
    if isinstance(x, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return {"prefix": {"addr": str(x.network_address), "len": x.prefixlen}}
    return str(x)


def _only_from(ports: list[tuple[int, int]], sets: str) -> list[list[Json]]:
    """TCP to ports: accepted from the sets' addresses, dropped from anywhere else."""
    dport = _match({"payload": {"protocol": "tcp", "field": "dport"}},
                   {"set": [{"range": list(p)} for p in ports]})  # fmt: skip
    return [
        [dport, _match(_saddr("ip"), f"@{sets}4"), {"accept": None}],
        [dport, _match(_saddr("ip6"), f"@{sets}6"), {"accept": None}],
        [dport, {"drop": None}],
    ]


def _saddr(protocol: str) -> Json:
    return {"payload": {"protocol": protocol, "field": "saddr"}}


def _ct_established() -> Json:
    # Replies to the node's own connections (an ephemeral port may fall in srun's range).
    return {"match": {"op": "in", "left": {"ct": {"key": "state"}},
                      "right": ["established", "related"]}}  # fmt: skip


def _iif_lo() -> Json:
    return _match({"meta": {"key": "iif"}}, "lo")


def _match(left: Json, right: object) -> Json:
    return {"match": {"op": "==", "left": left, "right": right}}


def _rule(*expr: Json) -> list[Json]:
    return list(expr)
