"""The node's nftables table as made from what the agent knows, and its keeper (no root:
libnftables is a fake here; integration/test_firewall.py runs the real one)."""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

import pytest

from llmgw_agentd import firewall, fwkeep
from llmgw_agentd.firewall import Wanted
from llmgw_agentd.nft import NftError

PORTS = (20000, 20999)


def _rules(batch: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [c["add"]["rule"]["expr"] for c in batch["nftables"] if "rule" in c.get("add", {})]


def _set(batch: dict[str, Any], name: str) -> list[Any]:
    for c in batch["nftables"]:
        s = c.get("add", {}).get("set")
        if s and s["name"] == name:
            return list(s.get("elem", []))
    raise AssertionError(f"no set {name}")


def _dports(rule: list[dict[str, Any]]) -> list[list[int]]:
    return [r["range"] for r in rule[0]["match"]["right"]["set"]]


def test_the_batch_names_only_its_own_table_and_replaces_it_whole() -> None:
    batch = firewall.ruleset(Wanted(PORTS, ("10.0.0.10",)))
    cmds = batch["nftables"]
    table = {"family": "inet", "name": "llmgw"}
    assert cmds[:3] == [{"add": {"table": table}}, {"delete": {"table": table}},
                        {"add": {"table": table}}]  # fmt: skip
    for c in cmds[3:]:
        [(verb, obj)] = c.items()
        [(_, body)] = obj.items()
        assert verb == "add" and (body["family"], body["table"]) == ("inet", "llmgw")
    [chain] = [c["add"]["chain"] for c in cmds[3:] if "chain" in c["add"]]
    assert chain["policy"] == "accept"  # only the ports named are ever dropped: ssh stays


def test_engine_ports_open_to_the_control_planes_and_the_node_only() -> None:
    batch = firewall.ruleset(Wanted(PORTS, ("10.0.0.10", "10.0.0.11", "fd00::10")))
    assert _set(batch, "planes4") == ["10.0.0.10", "10.0.0.11"]
    assert _set(batch, "planes6") == ["fd00::10"]
    rules = _rules(batch)
    assert rules[1] == [{"match": {"op": "==", "left": {"meta": {"key": "iif"}}, "right": "lo"}},
                        {"accept": None}]  # fmt: skip
    engine = rules[2:5]
    assert all(_dports(r) == [[20000, 20999]] for r in engine)
    assert [r[1]["match"]["right"] for r in engine[:2]] == ["@planes4", "@planes6"]
    assert engine[2][1:] == [{"drop": None}]
    assert len(rules) == 5  # Slurm off: its ports are not touched


def test_slurm_ports_open_to_the_cluster_networks_when_slurm_is_on() -> None:
    w = Wanted(PORTS, ("10.0.0.10",), slurm=True, networks=("10.0.0.11/24", "fd00::11/64"))
    batch = firewall.ruleset(w)
    assert _set(batch, "cluster4") == [{"prefix": {"addr": "10.0.0.0", "len": 24}}]
    assert _set(batch, "cluster6") == [{"prefix": {"addr": "fd00::", "len": 64}}]
    slurm = _rules(batch)[5:]
    assert [_dports(r) for r in slurm] == [[[6817, 6818], [60001, 63000]]] * 3
    assert [r[-1] for r in slurm] == [{"accept": None}, {"accept": None}, {"drop": None}]
    off = firewall.ruleset(Wanted(PORTS, ("10.0.0.10",), networks=("10.0.0.11/24",)))
    assert _set(off, "cluster4") == [] and len(_rules(off)) == 5


class FakeNft:
    """libnftables as the keeper sees it: batches run, a table there or not, or broken."""

    def __init__(self, broken: str = "") -> None:
        self.broken = broken
        self.batches: list[dict[str, Any]] = []
        self.present = False

    def run(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.broken:
            raise NftError(self.broken)
        if "list" in batch["nftables"][0]:
            if not self.present:
                raise NftError("No such file or directory")
            return {}
        self.batches.append(batch)
        self.present = True
        return {}


def _keeper(nft: FakeNft, planes: list[str]) -> fwkeep.Firewall:
    return fwkeep.Firewall(PORTS, lambda: planes, nft=lambda: nft)  # type: ignore[arg-type,return-value]


def test_the_table_is_set_again_only_on_change_or_when_it_went_missing() -> None:
    nft, planes = FakeNft(), ["https://10.0.0.10:7710"]
    fw = _keeper(nft, planes)
    fw.apply(fw.wanted())
    fw.apply(fw.wanted())
    assert len(nft.batches) == 1 and fw.status == "ok"
    planes.append("https://10.0.0.11:7710")  # the leader told of another control plane
    fw.apply(fw.wanted())
    assert len(nft.batches) == 2
    assert _set(nft.batches[-1], "planes4") == ["10.0.0.10", "10.0.0.11"]
    nft.present = False  # a site's `nft flush ruleset`
    fw.apply(fw.wanted())
    assert len(nft.batches) == 3


def test_a_broken_nftables_is_reported_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    nft = FakeNft(broken="cannot load libnftables.so.1")
    fw = _keeper(nft, ["https://10.0.0.10:7710"])
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            fw.apply(fw.wanted())
    assert fw.status == "nftables: cannot load libnftables.so.1"
    assert len([r for r in caplog.records if "firewall is not set" in r.message]) == 1
    nft.broken = ""
    fw.apply(fw.wanted())
    assert fw.status == "ok" and len(nft.batches) == 1


def test_control_planes_by_name_are_resolved() -> None:
    found = fwkeep.addresses(["https://localhost:7710", "https://10.1.2.3:7710", "https://[::1]"])
    assert {"127.0.0.1", "10.1.2.3", "::1"} <= set(found)


def test_slurm_on_restricts_its_ports_to_the_nodes_networks() -> None:
    nft = FakeNft()
    fw = _keeper(nft, ["https://10.0.0.10:7710"])
    fw.set_slurm(True)
    fw.apply(fw.wanted())
    assert _set(nft.batches[-1], "cluster4") + _set(nft.batches[-1], "cluster6") == [
        {"prefix": {"addr": str(ipaddress.ip_network(n).network_address),
                    "len": ipaddress.ip_network(n).prefixlen}}
        for n in fwkeep.networks()
    ]  # fmt: skip
    assert len(_rules(nft.batches[-1])) == 8
    fw.set_slurm(False)
    fw.apply(fw.wanted())
    assert len(_rules(nft.batches[-1])) == 5


def test_slurm_ports_open_to_the_peers_alone_where_the_leader_names_them() -> None:
    # An outside host on the node's own lan is refused 6817: the hosts, not their networks.
    nft = FakeNft()
    fw = _keeper(nft, ["https://10.0.0.10:7710"])
    fw.set_slurm(True, ["10.0.0.12", "10.0.0.10", "10.0.0.11"])
    fw.apply(fw.wanted())
    assert _set(nft.batches[-1], "cluster4") == [
        {"prefix": {"addr": f"10.0.0.{n}", "len": 32}} for n in (10, 11, 12)
    ]
    fw.set_slurm(True, ["10.0.0.10"])  # a node left Slurm: the table is made again
    fw.apply(fw.wanted())
    assert _set(nft.batches[-1], "cluster4") == [{"prefix": {"addr": "10.0.0.10", "len": 32}}]
