"""A mixed cluster (DESIGN.md, "Versions and a mixed cluster"): llmgw 0.1.0, built from its
tag, beside this tree on one cluster of three control planes on etcd serving SmolLM2. cp1 runs
this tree; cp2, cp3 and the agent host n1 run 0.1.0 (daemons and CLI). An agent one release
behind its control plane serves, and control planes of both releases lead in turn, /v1
answered through the official client (retries off) by each while it leads."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration import release
from integration.cp_cluster import CPS, CpCluster, cp_cluster, leader, planes
from integration.llmgw_node import Node, llama_server
from llmgw import package_version

pytestmark = pytest.mark.skipif(
    not Path("/usr/bin/etcd").exists(), reason="etcd is not installed (/usr/bin/etcd)"
)

OLD, NEW = release.PREVIOUS, package_version()
OLD_HOSTS = ("cp2", "cp3", "n1")


@pytest.fixture(scope="module")
def old(request: pytest.FixtureRequest) -> release.Release:
    """The previous release, built from its tag (or cached); progress on the terminal."""
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    say = terminal.write_line if terminal is not None else print
    t = time.monotonic()
    found = release.previous(say=say)
    if isinstance(found, str):
        pytest.skip(found)
    say(f"llmgw {OLD} ready in {time.monotonic() - t:.1f} s")
    return found


@pytest.fixture(scope="module")
def cluster(old: release.Release) -> Iterator[CpCluster]:
    """One cluster for the module: cp1 of this tree inits it; the others run 0.1.0."""
    assert NEW != OLD, f"this tree is still {OLD}: the test would mix nothing"

    def prepare(name: str, node: Node) -> None:
        if name in OLD_HOSTS:
            release.run_release(node.ps, old)
            node.venv = old.venv

    with cp_cluster("mixed", llama_server(), prepare=prepare) as c:
        print("\ntimings:", {k: round(v, 1) for k, v in c.timings.items()})
        yield c


def name_of(address: str) -> str:
    return next(n for n, ip in CPS.items() if ip == address)


def versions(node: Node) -> dict[str, tuple[str, str]]:
    """`llmgw planes` on node: each control plane's (release, role)."""
    return {name_of(p["name"]): (p["version"], p["role"]) for p in planes(node)}


def test_an_old_agent_serves_under_a_new_control_plane(cluster: CpCluster) -> None:
    cp1 = cluster.cps["cp1"]
    nodes = {n["name"]: n for n in cp1.llmgw("nodes", "--json")}
    assert nodes["n1"]["version"] == OLD and nodes["n1"]["connected"], nodes["n1"]
    said = cp1.llmgw("version", "--json")
    assert (said["cli"], said["llmgwd"]) == (NEW, NEW), said
    assert said["nodes"] == [{"name": "n1", "version": OLD}], said
    assert cp1.model()["ready"] == 1
    answers = cluster.chat_each(names=["cp1"])
    assert answers and all(a["ok"] for a in answers.values()), answers


def take_over(cluster: CpCluster, name: str) -> float:
    """Stop every other control plane's llmgwd, the leader last, until name leads; start them
    again once it does. Seconds from the leader's stop (its start) until name led."""
    target = cluster.cps[name]
    target.wait(lambda: bool(leader(target)), f"{name} sees a leader", 90)
    was = leader(target)
    others = sorted((n for n in cluster.cps if n != name), key=lambda n: CPS[n] == was)
    for n in others:
        t = time.monotonic()  # the last: the leader's stop
        cluster.cps[n].ps.systemctl("stop", "llmgwd.service")
    target.wait(lambda: leader(target) == CPS[name], f"{name} leads after {was}", 90)
    took = time.monotonic() - t
    target.wait_ready(1, timeout=90)  # `llmgw models` on it, as an operator would look
    answers = cluster.chat_each(names=[name])
    assert all(a["ok"] for a in answers.values()), (name, answers)
    for n in others:
        cluster.cps[n].ps.systemctl("start", "llmgwd.service")
    return took


def test_old_and_new_control_planes_lead_in_turn(cluster: CpCluster) -> None:
    cp1, cp2 = cluster.cps["cp1"], cluster.cps["cp2"]
    want = {"cp1": NEW, "cp2": OLD, "cp3": OLD}
    cp1.wait(lambda: {n: v for n, (v, _) in versions(cp1).items()} == want, "planes", 90)
    first = name_of(leader(cp1))
    turns = [first, *(["cp2", "cp1"] if want[first] == NEW else ["cp1", "cp2"])]
    answers = cluster.chat_each()
    assert all(a["ok"] for a in answers.values()), (first, answers)
    print(f"\n{first} ({want[first]}) leads first")
    for name in turns[1:]:
        took = take_over(cluster, name)
        print(f"\n{name} ({want[name]}) leads {took:.1f} s after its predecessor stopped")
        shown = versions(cluster.cps[name])  # its own CLI's `llmgw planes`
        assert shown[name] == (want[name], "leader"), shown
    cp2.wait(lambda: all(r == "standby" or r == "leader" for _, r in versions(cp2).values()),
             "every control plane back", 90)  # fmt: skip
    answers = cluster.chat_each()
    assert all(a["ok"] for a in answers.values()), answers
