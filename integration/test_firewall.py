"""The node's nftables table in network namespaces: a control plane, a node and an outside
host on a lan. The node's engine ports answer the control plane and drop the outside host;
other ports and another table are left alone; the table stays across an agent restart and
is replaced, not appended to."""

from __future__ import annotations

import json
from typing import Any

from integration.harness import MakeLan, MakeSystemd, PrivateSystemd
from integration.llmgw_node import VENV, Node, llama_server

CP, N1, OUT = "10.231.0.10", "10.231.0.11", "10.231.0.99"
ENGINE_PORT, OTHER_PORT = 20500, 7000

# Connects to HOST:PORT; prints "open", "refused" or "dropped" (no answer within 3 s: a
# dropped SYN is never answered, so the wait is no bet on timing).
PROBE = """
import socket, sys
s = socket.socket(); s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); print("open")
except ConnectionRefusedError:
    print("refused")
except (TimeoutError, socket.timeout):
    print("dropped")
"""
OTHERSITE = (
    "table inet othersite { chain c { type filter hook input priority 10; "
    "tcp dport 9 counter accept; }; }"
)


def probe(ps: PrivateSystemd, host: str, port: int) -> str:
    return str(ps.run([str(VENV / "bin/python"), "-c", PROBE, host, str(port)]).stdout.strip())


def table(ps: PrivateSystemd, name: str) -> list[dict[str, Any]]:
    r = ps.run(["nft", "-j", "list", "table", "inet", name], check=False)
    if r.returncode != 0:
        return []
    return [o for o in json.loads(r.stdout)["nftables"] if "metainfo" not in o]


def handle(ps: PrivateSystemd) -> int:
    """The table's own handle: new each time the table is made (its rules' restart at 1)."""
    return next((int(o["table"]["handle"]) for o in table(ps, "llmgw") if "table" in o), 0)


def rules(ps: PrivateSystemd) -> list[dict[str, Any]]:
    return [o["rule"] for o in table(ps, "llmgw") if "rule" in o]


def planes4(ps: PrivateSystemd) -> list[str]:
    sets = [o["set"] for o in table(ps, "llmgw") if "set" in o and o["set"]["name"] == "planes4"]
    return [str(e) for s in sets for e in s.get("elem", [])]


def listen(ps: PrivateSystemd, port: int) -> None:
    code = (
        "import http.server as h; "
        f"h.HTTPServer(('0.0.0.0', {port}), h.BaseHTTPRequestHandler).serve_forever()"
    )
    ps.run(["systemd-run", f"--unit=listen-{port}", str(VENV / "bin/python"), "-c", code])


def test_engine_ports_only_to_the_control_plane(
    make_systemd: MakeSystemd, make_lan: MakeLan
) -> None:
    binary = llama_server()
    lan = make_lan("fw")
    cp = Node(make_systemd("cp", net=True), 7700, 7710)
    lan.attach(cp.ps, 10)
    cp.install(binary, address=CP)
    cp.init_server(host=CP, agent=False)
    n1 = Node(make_systemd("n1", net=True, hostname="n1"), 7700, 7710)
    lan.attach(n1.ps, 11)
    out = make_systemd("out", net=True)
    lan.attach(out, 99)
    n1.install(binary, address=N1)
    n1.ps.run(["nft", OTHERSITE])
    other = table(n1.ps, "othersite")
    n1.start_agent()
    n1.join(cp.token(), server=cp, url=f"https://{CP}:7710")
    cp.wait(lambda: planes4(n1.ps) == [CP], "the node's table opens engine ports to the CP", 60)
    for port in (ENGINE_PORT, OTHER_PORT):
        listen(n1.ps, port)
    cp.wait(lambda: probe(cp.ps, N1, ENGINE_PORT) == "open", "engine port open to the CP", 20)
    assert probe(out, N1, ENGINE_PORT) == "dropped"
    assert probe(n1.ps, "127.0.0.1", ENGINE_PORT) == "open"  # the node itself
    assert probe(n1.ps, N1, ENGINE_PORT) == "open"
    assert probe(out, N1, OTHER_PORT) == "open"  # policy accept: nothing else is touched
    before = rules(n1.ps)
    print("\n" + n1.ps.run(["nft", "list", "table", "inet", "llmgw"]).stdout)

    # Stopped, the table stays; started again, it is made anew (a new table handle), the same
    # rules and no more: replaced, not appended to.
    made = handle(n1.ps)
    n1.ps.systemctl("stop", "llmgw-agentd.service")
    assert rules(n1.ps) == before
    assert probe(out, N1, ENGINE_PORT) == "dropped"
    n1.start_agent()
    cp.wait(lambda: handle(n1.ps) not in (made, 0), "the table made anew by the agent", 60)
    assert [r["expr"] for r in rules(n1.ps)] == [r["expr"] for r in before]

    # Removed by hand (a site's `nft flush ruleset` would): the agent sets it again, once.
    n1.ps.run(["nft", "delete", "table", "inet", "llmgw"])
    cp.wait(lambda: len(rules(n1.ps)) == len(before), "the table set again", 60)
    assert probe(out, N1, ENGINE_PORT) == "dropped"
    assert probe(cp.ps, N1, ENGINE_PORT) == "open"
    assert table(n1.ps, "othersite") == other  # never touched
    node = next(n for n in cp.llmgw("nodes", "--json") if n["name"] == "n1")
    print("n1 as the control plane sees it:", {k: v for k, v in node.items() if "fire" in k})
