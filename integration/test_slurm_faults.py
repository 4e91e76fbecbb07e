"""Slurm sharing under faults (issue 32), on Debian's real Slurm 22.05 in private systemds
(the three hosts of test_slurm.py): no llmgw engine beside a running job, no controller
stopped by a restart, no /v1 request lost while a node is lent."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from integration.harness import REPO
from integration.llmgw_node import MODEL, VENV
from integration.test_slurm import ADDRESSES, SlurmCluster, _drained_by_llmgw, slurm

__all__ = ["slurm"]  # the module's fixture, shared with test_slurm.py

BINARY = "/usr/local/lib/llmgw/llama-server"
# The real llama-server under a shell that ignores SIGTERM: the unit's main process does not
# end when stopped, as with a llama-server that hangs in its clean-up (issue 32, fault 3:
# 30 s there, until systemd's SIGKILL). Its requests are the real engine's.
DEAF = """#!/bin/sh
trap '' TERM
/usr/local/lib/llmgw/llama-server.real "$@" &
wait $!
"""
# A job that says what of llmgw's runs on its node as it starts.
PROBE = ("date +%s.%N > /tmp/{tag}.job; pgrep -c -x llama-server >> /tmp/{tag}.job; "
         "systemctl list-units --plain --no-legend 'llmgw-engine-*' >> /tmp/{tag}.job")  # fmt: skip


class Stream:
    """integration/chat_stream.py on n2's host, two clients through cp's /v1, while in the
    with-block; rows: one per request."""

    def __init__(self, cluster: SlurmCluster) -> None:
        url = f"http://{ADDRESSES['cp']}:7700/v1"
        script = str(REPO / "integration/chat_stream.py")
        self.argv = [*cluster.nodes["n2"].ps.nsenter(), str(VENV / "bin/python"), script,
                     cluster.key, MODEL, "2", url]  # fmt: skip
        self.rows: list[dict[str, Any]] = []

    def __enter__(self) -> Stream:
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self.proc.communicate("", timeout=120)
        self.rows = [json.loads(line) for line in out.splitlines() if line.strip()]

    def failures(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if not r["ok"]]


def _deafen(cluster: SlurmCluster, node: str) -> str:
    """node's engine restarted under DEAF (the agent restarts the one killed); its unit."""
    host = cluster.nodes[node]
    host.ps.run(["mv", BINARY, BINARY + ".real"])
    host.ps.write_file(BINARY, DEAF, mode=0o755)
    (unit,) = host.engine_units()
    host.ps.systemctl("kill", "-s", "KILL", unit)
    cluster.wait(lambda: _comm(cluster, node, unit) == "sh" and cluster.replica_nodes() == [node],
                 f"{node}'s engine again, under a shell deaf to SIGTERM", 120)  # fmt: skip
    return str(unit)


def _sbatch(cluster: SlurmCluster, node: str, script: str) -> str:
    """A batch job of script on node; its id."""
    r = cluster.cp.ps.run(["sbatch", "--parsable", "-w", node, "-D", "/tmp", "-o", "/dev/null",
                           "--wrap", script], timeout=30)  # fmt: skip
    return str(r.stdout.strip().split(";")[0])


def _comm(cluster: SlurmCluster, node: str, unit: str) -> str:
    pid = cluster.nodes[node].main_pid(unit)
    r = cluster.nodes[node].ps.run(["cat", f"/proc/{pid}/comm"], check=False)
    return r.stdout.strip() if pid else ""


def test_a_lend_waits_for_an_engine_deaf_to_sigterm(slurm: SlurmCluster) -> None:
    """Lending the node of a ready replica whose engine ignores SIGTERM, under steady /v1
    load: no request fails, and the job sent to the node starts only once the engine's unit
    is gone (killed stop_timeout_s after its SIGTERM)."""
    slurm.cp.llmgw("model", "serve", MODEL, "--replicas", "1")
    slurm.wait(lambda: all(_drained_by_llmgw(slurm, n) for n in ("n1", "n2"))
               and len(slurm.replica_nodes()) == 1, "set up, one replica ready", 240)  # fmt: skip
    (lent,) = slurm.replica_nodes()
    host = slurm.nodes[lent]
    unit = _deafen(slurm, lent)
    tag = "deaf"
    try:
        with Stream(slurm) as stream:
            time.sleep(3)  # the stream under way
            lend_at = time.time()
            slurm.cp.llmgw("slurm", "lend", lent)
            job = _sbatch(slurm, lent, PROBE.format(tag=tag))
            gone_at = 0.0
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and slurm.job_state(job) != "COMPLETED":
                if not gone_at and unit not in host.engine_units():
                    gone_at = time.time()
                time.sleep(0.5)
            time.sleep(3)  # the stream goes on after the lend
        assert slurm.job_state(job) == "COMPLETED", slurm.journals()
        said = host.ps.read_file(f"/tmp/{tag}.job").splitlines()
        started = float(said[0])
        print(f"\nlend at 0; {unit} gone at {gone_at - lend_at:.1f}s; the job started at "
              f"{started - lend_at:.1f}s; {len(stream.rows)} /v1 requests, "
              f"{len(stream.failures())} failed")  # fmt: skip
        # No engine of llmgw's on the node when the job started there.
        assert said[1:] == ["0"], said
        assert stream.rows and not stream.failures(), stream.failures()[:3]
        journal = host.ps.journal(unit, 30)
        assert "Killing" in journal or "SIGKILL" in journal, journal  # deaf: killed at the bound
    finally:
        host.ps.run(["mv", "-f", BINARY + ".real", BINARY], check=False)
        slurm.cp.llmgw("slurm", "reclaim", lent)
        slurm.wait(lambda: slurm.node_status(lent)["status"] == "in llmgw", f"{lent} back", 120)
