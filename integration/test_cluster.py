"""Three nodes and a control plane, each a private systemd on a lan: replicas spread, move off
a node that failed to start them or was cut off, and an on-demand model wakes and parks."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from integration.harness import Lan, MakeLan, MakeSystemd
from integration.llmgw_node import MODEL, VENV, Node, gguf, llama_server

CP = "10.231.0.10"
NODES = {"n1": "10.231.0.11", "n2": "10.231.0.12", "n3": "10.231.0.13"}
GRACE_S = 8
IDLE_S = 30
ON_DEMAND = "smol-od"

# Run inside the control plane's host (the lan is in its own namespace): chat requests with
# the official client, every `gap` seconds until /tmp/stop exists or `count` were made, or
# `together` at once; prints one JSON line of what came back.
CLIENT = """
import json, os, sys, time, concurrent.futures as cf, openai
model, key, count, gap, together = sys.argv[1], sys.argv[2], int(sys.argv[3]), \\
    float(sys.argv[4]), int(sys.argv[5])
# No retries: a request in flight on a node at the moment it is cut off (no reset comes back)
# is sent to another replica by llmgwd once the node's grace period ends, not by the client.
c = openai.OpenAI(base_url="http://CP:7700/v1", api_key=key, max_retries=0,
                  timeout=90 if gap else 150)
def one(_=None):
    t = time.monotonic()
    try:
        r = c.chat.completions.create(model=model, max_tokens=8,
                                      messages=[{"role": "user", "content": "Say hi."}])
        return {"ok": bool(r.choices[0].message.content), "s": time.monotonic() - t}
    except Exception as e:
        return {"ok": False, "error": repr(e)[:200], "s": time.monotonic() - t}
if together:
    with cf.ThreadPoolExecutor(together) as ex:
        out = list(ex.map(one, range(together)))
else:
    out = []
    while len(out) < count and not (len(out) >= 10 and os.path.exists("/tmp/stop")):
        out.append(one())
        time.sleep(gap)
print(json.dumps(out))
""".replace("CP", CP)


class Cluster:
    """The control plane and its three nodes."""

    def __init__(self, cp: Node, nodes: dict[str, Node], key: str) -> None:
        self.cp, self.nodes, self.key = cp, nodes, key

    def client_argv(
        self, model: str, count: int = 1, gap: float = 0, together: int = 0
    ) -> list[str]:
        return [*self.cp.ps.nsenter(), str(VENV / "bin/python"), "-c", CLIENT, model, self.key,
                str(count), str(gap), str(together)]  # fmt: skip

    def chat(self, model: str, together: int = 0) -> list[dict[str, Any]]:
        argv = self.client_argv(model, count=1, together=together)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
        out: list[dict[str, Any]] = json.loads(r.stdout)
        return out

    def where(self, model: str = MODEL, state: str = "ready") -> list[str]:
        m = self.cp.model(model)
        return sorted(r["node"] for r in m["replica_status"] if r["state"] == state)

    def units(self) -> dict[str, list[str]]:
        return {name: n.engine_units() for name, n in self.nodes.items()}


@pytest.fixture
def cluster(make_systemd: MakeSystemd, make_lan: MakeLan) -> Iterator[Cluster]:
    binary = llama_server()
    lan: Lan = make_lan("cl")
    cp = Node(make_systemd("cp", net=True), 7700, 7710)
    lan.attach(cp.ps, 10)
    cp.install(binary, address=CP)
    cp.init_server(host=CP, agent=False, extra=f"node_grace_s: {GRACE_S}\n")
    nodes: dict[str, Node] = {}
    for name, address in NODES.items():
        n = Node(make_systemd(name, net=True, hostname=name), 7700, 7710)
        lan.attach(n.ps, int(address.rsplit(".", 1)[1]))
        # n3 cannot start engines at first: its engine binary is not there.
        binary_path = "/nonexistent/llama-server" if name == "n3" else ""
        n.install(binary, address=address)
        if binary_path:
            n.agent_config(address, binary=binary_path)
        n.start_agent()
        n.join(cp.token(), server=cp, url=f"https://{CP}:7710")
        nodes[name] = n
    key = cp.llmgw("key", "create", "tests", "--json")["key"]
    yield Cluster(cp, nodes, key)


def test_replicas_spread_fail_over_and_wake_on_demand(cluster: Cluster) -> None:
    cp = cluster.cp
    cp.llmgw("model", "add", MODEL, "--from", f"file:{gguf()}")
    cp.llmgw("model", "serve", MODEL, "--replicas", "2")
    cp.wait(lambda: len(cluster.where()) == 2, "two replicas ready", 180)
    first = cluster.where()
    print("\nsmollm2 ready on", first)
    assert first == ["n1", "n2"]  # two different nodes (n3: the names' order, and least load)
    print(cp.llmgw("model", "plan", MODEL).stdout)

    _wake_on_demand_past_a_failing_node(cluster)
    _parked_then_twenty_start_one(cluster)
    _fail_over_when_a_node_is_cut_off(cluster)
    _cut_off_node_stops_its_old_engine(cluster)


def _wake_on_demand_past_a_failing_node(cluster: Cluster) -> None:
    """The first request wakes an on-demand model; its replica fails on n3 and moves."""
    cp, nodes = cluster.cp, cluster.nodes
    # On demand, with n3 unable to start engines: the first request wakes it, the replica
    # fails on n3 (the least loaded node), moves to another, and the request is answered.
    cp.llmgw("model", "add", ON_DEMAND, "--from", f"file:{gguf()}", "--on-demand",
             "--idle", str(IDLE_S))  # fmt: skip
    assert cp.model(ON_DEMAND)["parked"]
    t = time.monotonic()
    [answer] = cluster.chat(ON_DEMAND)
    print(f"on-demand first request: {answer} after {time.monotonic() - t:.1f}s")
    assert answer["ok"], answer
    assert cluster.where(ON_DEMAND) in (["n1"], ["n2"])
    plan = cp.llmgw("model", "plan", ON_DEMAND, "--json")
    assert plan["failed_on"] == ["n3"]
    cp.wait(lambda: not nodes["n3"].engine_units(), "n3's failed engine stopped", 60)


def _parked_then_twenty_start_one(cluster: Cluster) -> None:
    """Parked after the idle time; twenty requests together start one replica."""
    cp = cluster.cp
    # Parked after the idle time; then twenty requests together start one replica.
    cp.wait(lambda: cp.model(ON_DEMAND)["parked"] and not cluster.where(ON_DEMAND),
            "parked after idle", IDLE_S + 60)  # fmt: skip
    assert sum(len(u) for u in cluster.units().values()) == 2  # smollm2's two only
    answers = cluster.chat(ON_DEMAND, together=20)
    print("twenty together:", sum(a["ok"] for a in answers), "answered")
    assert all(a["ok"] for a in answers), answers
    assert len(cp.model(ON_DEMAND)["replica_status"]) == 1
    assert sum(len(u) for u in cluster.units().values()) == 3
    cp.wait(lambda: cp.model(ON_DEMAND)["parked"] and not cluster.where(ON_DEMAND),
            "parked again", IDLE_S + 60)  # fmt: skip


def _fail_over_when_a_node_is_cut_off(cluster: Cluster) -> None:
    """n3 mended, n1 cut off: its replica starts elsewhere while /v1 keeps answering."""
    cp, nodes = cluster.cp, cluster.nodes
    # n3 mended; n1 cut off: its replica is started elsewhere while /v1 keeps answering.
    nodes["n3"].agent_config(NODES["n3"])
    nodes["n3"].ps.systemctl("restart", "llmgw-agentd.service")
    cp.wait(lambda: "n3" in cp.connected(), "n3 back after its agent's restart", 60)
    loop = subprocess.Popen(cluster.client_argv(MODEL, count=400, gap=0.5),
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        time.sleep(2)
        t = time.monotonic()
        nodes["n1"].ps.run(["ip", "link", "set", "dev", "eth0", "down"])
        cp.wait(lambda: cluster.where() == ["n2", "n3"], "n1's replica moved to n3", 180)
        print(f"moved to n3 {time.monotonic() - t:.1f}s after the cut")
        time.sleep(5)  # and a few requests more, after the move
    finally:
        cp.ps.write_file("/tmp/stop", "")
        out, _ = loop.communicate(timeout=200)
    results = json.loads(out)
    failed = [r for r in results if not r["ok"]]
    print(f"during the move: {len(results)} requests, {len(failed)} failed, "
          f"slowest {max(r['s'] for r in results):.1f}s")  # fmt: skip
    assert len(results) >= 10 and not failed, failed
    lost = [line for line in cp.ps.journal("llmgwd.service", 400).splitlines() if " lost" in line]
    print("llmgwd on the loss:", *lost, sep="\n  ")


def _cut_off_node_stops_its_old_engine(cluster: Cluster) -> None:
    """n1 comes back: told it no longer runs the replica, its agent stops the engine."""
    cp, nodes = cluster.cp, cluster.nodes
    # n1 comes back: told it no longer runs the replica, its agent stops the engine.
    assert nodes["n1"].engine_units()  # still running, cut off
    nodes["n1"].ps.run(["ip", "link", "set", "dev", "eth0", "up"])
    cp.wait(lambda: "n1" in cp.connected(), "n1 connected again", 120)
    cp.wait(lambda: not nodes["n1"].engine_units(), "n1's old engine stopped", 60)
    assert cluster.where() == ["n2", "n3"]
    print("n1 back; its engine stopped; smollm2 on", cluster.where())
