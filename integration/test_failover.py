"""Failover of three control planes on etcd with two agent hosts serving SmolLM2 on the real
llama-server, on one cluster, one fault after another, each left healthy for the next: the
leader's llmgwd killed (-9), paused past its lease, its host cut off. Each time a new leader,
the engines untouched, /v1 answered through the others all along by the official client
with its retries off, and the old leader back as a standby; a history of admin writes made
through all three meanwhile is all there afterwards, nothing twice."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.cp_cluster import CLIENT_PORT, CPS, CpCluster, api, cp_cluster, leader, planes
from integration.llmgw_node import Node, llama_server
from integration.steady import Stream
from integration.write_history import History, problems, store_view

pytestmark = pytest.mark.skipif(
    not Path("/usr/bin/etcd").exists(), reason="etcd is not installed (/usr/bin/etcd)"
)

NO_RESTART = "/run/systemd/system/llmgwd.service.d/no-restart.conf"


@pytest.fixture(scope="module")
def cluster() -> Iterator[CpCluster]:
    with cp_cluster("fo", llama_server(), agents=2) as c:
        print("\ntimings:", {k: round(v, 1) for k, v in c.timings.items()})
        c.cps["cp1"].wait_ready(2)
        yield c


@pytest.fixture(scope="module")
def history(cluster: CpCluster) -> Iterator[History]:
    h = History(cluster.cps)
    h.start()
    yield h
    h.stop()


def by_address(cluster: CpCluster, address: str) -> tuple[str, Node]:
    name = next(n for n, ip in CPS.items() if ip == address)
    return name, cluster.cps[name]


def healthy(cluster: CpCluster, timeout: float = 120.0) -> str:
    """Wait until every control plane lists three healthy voters and the same one leader,
    the others standbys; returns the leader's address."""
    deadline = time.monotonic() + timeout
    seen: Any = None
    while time.monotonic() < deadline:
        try:
            seen = [planes(n) for n in cluster.cps.values()]
            leads = {s["name"] for view in seen for s in view if s["role"] == "leader"}
            fine = all(len(v) == 3 and all(s["health"] == "healthy" and not s["learner"]
                                           and s["role"] in ("leader", "standby") for s in v)
                       for v in seen)  # fmt: skip
            if fine and len(leads) == 1:
                return str(leads.pop())
        except Exception as e:
            seen = repr(e)
        time.sleep(1)
    raise AssertionError(f"the cluster is not healthy after {timeout}s: {seen}")


def new_leader(survivor: Node, old: str, since: float, timeout: float = 60.0) -> tuple[str, float]:
    """Poll survivor's `llmgw planes` until another than old leads: (who, seconds since)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            who = leader(survivor, timeout=3)
        except Exception:
            who = ""
        if who and who != old:
            return who, time.time() - since
        time.sleep(0.2)
    raise AssertionError(f"no new leader after {timeout}s:\n{survivor.ps.journal('llmgwd', 40)}")


def stream(cluster: CpCluster, names: list[str]) -> Stream:
    """chat_stream.py on the first agent host, two clients to the given control planes."""
    host = next(iter(cluster.agents.values()))
    urls = [f"http://{CPS[n]}:{CLIENT_PORT}/v1" for n in names]
    return Stream(cluster.key, urls, inside=host.ps.nsenter())


def survivors(cluster: CpCluster, old: str) -> list[str]:
    return [n for n in cluster.cps if CPS[n] != old]


def steady(cluster: CpCluster, s: Stream, before: dict[str, list[int]]) -> None:
    """The stream's requests all answered and the engines the same processes."""
    assert s.rows and not s.failures(), s.failures()
    assert cluster.engine_pids() == before, (cluster.engine_pids(), before)


def test_leader_killed(cluster: CpCluster, history: History) -> None:
    old = healthy(cluster)
    name, victim = by_address(cluster, old)
    others = survivors(cluster, old)
    pids = cluster.engine_pids()
    victim.ps.write_file(NO_RESTART, "[Service]\nRestart=no\n")  # dead until started again
    victim.ps.systemctl("daemon-reload")
    with stream(cluster, others) as s:
        time.sleep(3)
        t_kill = time.time()
        victim.ps.systemctl("kill", "--signal=KILL", "llmgwd.service")
        who, took = new_leader(cluster.cps[others[0]], old, t_kill)
        time.sleep(5)
    print(f"\nkill -9 of {name}'s llmgwd ({old}): {who} leads {took:.1f} s later")
    s.report("kill -9", t_kill)
    victim.ps.run(["rm", NO_RESTART])
    victim.ps.systemctl("daemon-reload")
    victim.ps.systemctl("start", "llmgwd.service")
    t = time.monotonic()
    assert healthy(cluster) == who
    print(f"{name} restarted: a standby again {time.monotonic() - t:.1f} s after its start")
    steady(cluster, s, pids)


def _cordon(node: Node, agent: str, out: list[Any]) -> None:
    try:
        out.append(api(node, "POST", f"/nodes/{agent}/cordon", {}, timeout=60))
    except Exception as e:
        out.append(repr(e))


def test_leader_paused_past_its_lease(cluster: CpCluster, history: History) -> None:
    old = healthy(cluster)
    name, victim = by_address(cluster, old)
    others = survivors(cluster, old)
    pids = cluster.engine_pids()
    pid = str(victim.main_pid("llmgwd.service"))
    agent = next(iter(cluster.agents))
    asked: list[Any] = []
    with stream(cluster, others) as s:
        time.sleep(3)
        t_stop = time.time()
        victim.ps.run(["kill", "-STOP", pid])
        who, took = new_leader(cluster.cps[others[0]], old, t_stop)
        # A leader's write waiting for it when it wakes: cordon a node (fenced by its term).
        cordon = threading.Thread(target=_cordon, args=(victim, agent, asked))
        cordon.start()
        time.sleep(2)
        victim.ps.run(["kill", "-CONT", pid])
        cordon.join(90)
        time.sleep(3)
    print(f"\nSIGSTOP of {name}'s llmgwd ({old}): {who} leads {took:.1f} s later; the cordon "
          f"asked of it while paused answered {asked}")  # fmt: skip
    s.report("SIGSTOP", t_stop)
    assert healthy(cluster) == who
    said = victim.ps.run(["journalctl", "--no-pager", "-u", "llmgwd.service", "-g",
                          "refused|stepping down|no longer leads"], check=False).stdout  # fmt: skip
    print(said)
    _, nodes = api(cluster.cps[by_address(cluster, who)[0]], "GET", "/nodes")
    assert not any(n["cordoned"] for n in nodes), nodes  # nothing of the old term written
    assert "no longer leads" in said
    steady(cluster, s, pids)


def test_leader_cut_off(cluster: CpCluster, history: History) -> None:
    old = healthy(cluster)
    name, victim = by_address(cluster, old)
    others = survivors(cluster, old)
    pids = cluster.engine_pids()
    with stream(cluster, others) as s:
        time.sleep(3)
        t_cut = time.time()
        victim.ps.run(["ip", "link", "set", "eth0", "down"])
        who, took = new_leader(cluster.cps[others[0]], old, t_cut)
        time.sleep(5)
        victim.ps.run(["ip", "link", "set", "eth0", "up"])
        t_up = time.monotonic()
        now = healthy(cluster)
        assert now == who, moved(by_address(cluster, who)[1])
        back = time.monotonic() - t_up
    print(f"\n{name} ({old}) cut off: {who} leads {took:.1f} s later; link up: {name} a "
          f"healthy standby {back:.1f} s later")  # fmt: skip
    s.report("link down", t_cut)
    steady(cluster, s, pids)


def moved(node: Node) -> str:
    """Why node stopped leading, as its llmgwd and etcd member tell."""
    grep = ["journalctl", "--no-pager", "-o", "short-precise", "-g"]
    said = node.ps.run([*grep, "lead|lease", "-u", "llmgwd.service"], check=False).stdout
    etcd = node.ps.run([*grep, "elected|became|term", "-u", "llmgw-etcd.service"], check=False)
    return f"{said[-3000:]}\n{etcd.stdout[-3000:]}"


def test_history_of_writes_kept(cluster: CpCluster, history: History) -> None:
    history.stop()
    views = {}
    for name, node in cluster.cps.items():  # each control plane's catalog caught up
        node.wait(lambda n=node: store_view(n) == store_view(cluster.cps["cp1"]), "same view")
        views[name] = store_view(node)
    view = views["cp1"]
    found = problems(history, view)
    counts = history.counts()
    kinds = {k: sum(1 for w in history.writes if w.kind == k) for k in ("key", "model", "price")}
    print(f"\nhistory: {len(history.writes)} writes {kinds}: {counts}")
    for w in history.writes:
        if w.outcome != "ack":
            prices = dict(view["models"])
            there = (
                w.name in view["key_names"]
                if w.kind == "key"
                else prices.get(w.name) == w.value
                if w.kind == "price"
                else w.name in prices
            )
            print(f"  {w.outcome} {w.kind} {w.name} via {w.cp} ({w.detail}); there: {there}")
    assert counts.get("ack", 0) > 0
    assert not found, found
