"""Three control planes on etcd and an agent host, each a private systemd on one lan: the first
made with `llmgw plane init` then `llmgw plane migrate --to etcd`, the others added with
`llmgw plane token` and `llmgw plane join`; SmolLM2 served by the real llama-server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from integration.harness import REPO, Lan, PrivateSystemd, binds, shutdown_all
from integration.llmgw_node import MODEL, VENV, Node, gguf
from llmgw import ipc

PREFIX = "10.232.0"
CPS = {"cp1": f"{PREFIX}.11", "cp2": f"{PREFIX}.12", "cp3": f"{PREFIX}.13"}
AGENTS = {"n1": f"{PREFIX}.21"}
MORE_AGENTS = {"n2": f"{PREFIX}.22"}  # the second agent host, for cp_cluster(agents=2)
CLIENT_PORT, CLUSTER_PORT = 7700, 7710
ETCD_UNIT = "llmgw-etcd.service"
Prepare = Callable[[str, Node], None]  # a host's name and its node, installed, not started

# Run inside a host of the lan: one chat request with the official client to each base URL
# given, its retries off; prints one JSON line, {url: {"ok", "error"?}}.
CLIENT = """
import json, sys, openai
key, model, urls = sys.argv[1], sys.argv[2], sys.argv[3:]
out = {}
for url in urls:
    c = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60)
    try:
        r = c.chat.completions.create(model=model, max_tokens=8, temperature=0, seed=1,
                                      messages=[{"role": "user", "content": "Say hi."}])
        out[url] = {"ok": bool(r.choices[0].message.content)}
    except Exception as e:
        out[url] = {"ok": False, "error": repr(e)[:300]}
print(json.dumps(out))
"""


@dataclass
class Before:
    """What the SQLite control plane held just before `llmgw plane migrate --to etcd`."""

    models: list[dict[str, Any]]
    keys: list[dict[str, Any]]
    usage: list[dict[str, Any]]
    engine_pids: dict[str, list[int]]
    migrate_out: str = ""


@dataclass
class CpCluster:
    """The control planes (by name: cp1 first), the agent hosts and a key for /v1."""

    cps: dict[str, Node]
    agents: dict[str, Node]
    key: str = ""
    before: Before | None = None
    timings: dict[str, float] = field(default_factory=dict)
    join_out: dict[str, str] = field(default_factory=dict)  # what each join said

    def client_urls(self) -> list[str]:
        return [f"http://{CPS[name]}:{CLIENT_PORT}/v1" for name in self.cps]

    def chat_each(
        self, host: Node | None = None, names: list[str] | None = None
    ) -> dict[str, dict[str, Any]]:
        """One chat request through each control plane (or those named), from host (the
        agent host)."""
        host = host or next(iter(self.agents.values()))
        urls = [f"http://{CPS[n]}:{CLIENT_PORT}/v1" for n in names] if names else self.client_urls()
        argv = [*host.ps.nsenter(), str(VENV / "bin/python"), "-c", CLIENT, self.key, MODEL,
                *urls]  # fmt: skip
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
        out: dict[str, dict[str, Any]] = json.loads(r.stdout)
        return out

    def engine_pids(self) -> dict[str, list[int]]:
        """Each agent host's engines' main PIDs."""
        return {name: sorted(n.main_pid(u) for u in n.engine_units())
                for name, n in self.agents.items()}  # fmt: skip


def install_etcd_unit(ps: PrivateSystemd) -> None:
    """llmgw-etcd.service as the package installs it (Debian's etcd-server is on /)."""
    text = (REPO / "units" / ETCD_UNIT).read_text()
    ps.write_file(f"/etc/systemd/system/{ETCD_UNIT}", text)
    ps.systemctl("daemon-reload")


def llmgw(node: Node, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The CLI inside node, allowed longer than Node.llmgw (a join waits for its member)."""
    return node.ps.run([str(node.venv / "bin/llmgw"), *args], timeout=timeout)


def planes(node: Node) -> list[dict[str, Any]]:
    """`llmgw planes --json` on node."""
    found: list[dict[str, Any]] = node.llmgw("planes", "--json")
    return found


def api(node: Node, method: str, path: str, body: object = None,
        timeout: float = 10.0) -> tuple[int, Any]:  # fmt: skip
    """One /api/v1 call on node's llmgwd socket, from this process (through /proc/PID/root:
    no CLI started inside, so it is quick enough to poll); ipc.IpcError when unreachable."""
    sock = f"/proc/{node.ps.pid}/root/run/llmgw/llmgwd.sock"
    return ipc.request(sock, method, f"/api/v1{path}", body, timeout=timeout)


def leader(node: Node, timeout: float = 5.0) -> str:
    """Who leads, as node's `llmgw planes` says ("": nobody; the name is its address)."""
    status, found = api(node, "GET", "/planes", timeout=timeout)
    if status != 200:
        return ""
    return next((s["name"] for s in found if s["role"] == "leader"), "")


class Booted:
    """Boots the hosts and the lan, and shuts them all down at the end; prepare(name, node),
    where given, is called on each host once installed, before anything in it starts."""

    def __init__(self, label: str, prefix: str = PREFIX, prepare: Prepare | None = None) -> None:
        self.label = re.sub(r"[^A-Za-z0-9_.-]", "-", label)[:30]
        self.lan = Lan(f"{self.label}-{os.getpid()}", prefix)
        self.made: list[PrivateSystemd] = []
        self.prepare = prepare

    def host(self, name: str, ip: str, binary: str) -> Node:
        """A private systemd on the lan at ip, with llmgw's units from the checkout."""
        ps = PrivateSystemd(f"{self.label}-{name}-{os.getpid()}", binds=binds(), net=True,
                            hostname=name)  # fmt: skip
        self.made.append(ps)
        ps.boot()
        self.lan.attach(ps, int(ip.rsplit(".", 1)[1]))
        node = Node(ps, CLIENT_PORT, CLUSTER_PORT)
        node.install(binary, address=ip)
        if self.prepare is not None:
            self.prepare(name, node)
        return node

    def close(self) -> None:
        errors = shutdown_all(self.made)
        self.lan.destroy()
        if errors:
            raise RuntimeError("; ".join(errors))


def _first(cluster: CpCluster, booted: Booted, binary: str, agents: int) -> Node:
    """cp1 on SQLite with the agents joined, SmolLM2 served (one replica an agent host) and
    used, then migrated."""
    cp1 = booted.host("cp1", CPS["cp1"], binary)
    install_etcd_unit(cp1.ps)
    cp1.init_server(host=CPS["cp1"], agent=False, extra="node_grace_s: 10\n")
    for name, ip in list({**AGENTS, **MORE_AGENTS}.items())[:agents]:
        n = booted.host(name, ip, binary)
        n.start_agent()
        n.join(cp1.token(), server=cp1, url=f"https://{CPS['cp1']}:{CLUSTER_PORT}")
        cluster.agents[name] = n
    cp1.llmgw("model", "add", MODEL, "--from", f"file:{gguf()}", "--engine", "llama.cpp")
    cp1.llmgw("model", "serve", MODEL, "--replicas", str(agents))
    cp1.wait_ready(agents)
    cluster.cps["cp1"] = cp1
    cluster.key = cp1.llmgw("key", "create", "tests", "--json")["key"]
    answers = cluster.chat_each()
    assert all(a["ok"] for a in answers.values()), answers
    return cp1


def _migrate(cluster: CpCluster, cp1: Node) -> None:
    time.sleep(1)  # usage is counted in memory: written at llmgwd's stop, which migrate makes
    cluster.before = Before(
        models=cp1.llmgw("models", "--json"),
        keys=cp1.llmgw("key", "list", "--json"),
        usage=cp1.llmgw("usage", "--json"),
        engine_pids=cluster.engine_pids(),
    )
    t = time.monotonic()
    r = llmgw(cp1, "plane", "migrate", "--to", "etcd")
    cluster.timings["migrate_s"] = time.monotonic() - t
    cluster.before.migrate_out = r.stdout + r.stderr


def _join(cluster: CpCluster, booted: Booted, name: str, binary: str) -> None:
    cp1 = cluster.cps["cp1"]
    node = booted.host(name, CPS[name], binary)
    install_etcd_unit(node.ps)
    token = cp1.llmgw("plane", "token", "--json")["token"]
    t = time.monotonic()
    r = llmgw(node, "plane", "join", f"https://{CPS['cp1']}:{CLUSTER_PORT}", "--token", token,
              "--advertise", f"https://{CPS[name]}:{CLUSTER_PORT}")  # fmt: skip
    cluster.timings[f"join_{name}_s"] = time.monotonic() - t
    cluster.join_out[name] = r.stderr + r.stdout
    cluster.cps[name] = node


@contextlib.contextmanager
def cp_cluster(
    label: str, binary: str, agents: int = 1, prepare: Prepare | None = None
) -> Iterator[CpCluster]:
    """The whole cluster, built as an operator would, with agents agent hosts (1 or 2), each
    host given to prepare (Booted's) before it starts; every host shut down after."""
    booted = Booted(label, prepare=prepare)
    booted.lan.create()
    cluster = CpCluster(cps={}, agents={})
    try:
        cp1 = _first(cluster, booted, binary, agents)
        _migrate(cluster, cp1)
        for name in CPS:
            if name != "cp1":
                _join(cluster, booted, name, binary)
        yield cluster
    finally:
        booted.close()
