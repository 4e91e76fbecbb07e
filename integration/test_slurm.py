"""Nodes shared with Slurm, on Debian's real Slurm (22.05) in private systemds on a lan: a
control plane whose node runs slurmctld, and two nodes running slurmd from the leader's files.
Lending moves llmgw's replica away first; reclaiming waits for the running job; a drain a
Slurm administrator made is never lifted; a restarted control plane loses no job."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from integration.conftest import unavailable
from integration.cp_cluster import CLIENT, Booted
from integration.llmgw_node import MODEL, VENV, Node, llama_server
from integration.test_firewall import probe

pytestmark = pytest.mark.skipif(
    shutil.which("slurmctld") is None or shutil.which("slurmd") is None,
    reason="Debian's slurmctld and slurmd are not installed (.ci/run installs them)",
)

ADDRESSES = {"cp": "10.233.0.10", "n1": "10.233.0.11", "n2": "10.233.0.12"}
OUTSIDE = "10.233.0.99"  # a host on the lan that is not in the cluster
NOT_LENT = "llmgw: not lent to Slurm"


@dataclass
class SlurmCluster:
    """The control plane's node (cp, the Slurm controller) and the two nodes, and a key."""

    cp: Node
    nodes: dict[str, Node]
    key: str
    outside: Node

    def sinfo(self) -> dict[str, tuple[str, str]]:
        """node -> (state, reason) as the controller's sinfo says."""
        r = self.cp.ps.run(["sinfo", "-h", "-N", "-o", "%N|%T|%E"], check=False, timeout=30)
        out: dict[str, tuple[str, str]] = {}
        for line in r.stdout.splitlines():
            name, state, reason = [*line.split("|", 2), "", ""][:3]
            out[name.strip()] = (state.strip(), reason.strip())
        return out

    def state(self, node: str) -> str:
        return self.sinfo().get(node, ("", ""))[0]

    def status(self) -> dict[str, Any]:
        """GET /api/v1/slurm as `llmgw slurm status --json` shows it."""
        found: dict[str, Any] = self.cp.llmgw("slurm", "status", "--json")
        return found

    def node_status(self, node: str) -> dict[str, Any]:
        found: dict[str, Any] = next(n for n in self.status()["status"] if n["name"] == node)
        return found

    def replica_nodes(self) -> list[str]:
        """The nodes where the model has a ready replica."""
        model = self.cp.model(MODEL)
        return sorted(r["node"] for r in model["replica_status"] if r["state"] == "ready")

    def chat(self) -> bool:
        """One chat through the control plane with the official client, from n2's host."""
        url = f"http://{ADDRESSES['cp']}:7700/v1"
        argv = [str(VENV / "bin/python"), "-c", CLIENT, self.key, MODEL, url]
        answer = json.loads(self.nodes["n2"].ps.run(argv, timeout=120).stdout)[url]
        assert answer["ok"], answer
        return True

    def sbatch(self, node: str, seconds: int, tag: str) -> str:
        """A batch job on node that sleeps, then writes /tmp/TAG.done there; its job id."""
        script = f"sleep {seconds}; echo done > /tmp/{tag}.done"
        r = self.cp.ps.run(["sbatch", "--parsable", "-w", node, "-D", "/tmp", "-o", "/dev/null",
                            "--wrap", script], timeout=30)  # fmt: skip
        return str(r.stdout.strip().split(";")[0])

    def job_state(self, job: str) -> str:
        r = self.cp.ps.run(["scontrol", "-o", "show", "job", job], check=False, timeout=30)
        words = dict(w.partition("=")[::2] for w in r.stdout.split() if "=" in w)
        return words.get("JobState", "")

    def wait(self, ok: Any, what: str, timeout: float = 120.0) -> None:
        try:
            self.cp.wait(ok, what, timeout)
        except AssertionError as e:
            status = self.cp.llmgw("slurm", "status", "--json", check=False)
            raise AssertionError(f"{e}\nsinfo: {self.sinfo()}\nllmgw: {status}\n"
                                 + self.journals()) from None  # fmt: skip

    def journals(self) -> str:
        out = self.cp.ps.journal("slurmctld.service", 20)
        for n in self.nodes.values():
            out += n.ps.journal("slurmd.service", 10) + n.ps.journal("llmgw-agentd.service", 15)
        return out


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    """The three hosts joined (booted once for the module), the model served on n1 or n2 (cp
    is cordoned for llmgw), and Slurm set up with cp as controller and n1, n2 as its nodes."""
    why = unavailable()
    if why:
        pytest.skip(why)
    binary = llama_server()
    booted = Booted("slurm", prefix="10.233.0")
    booted.lan.create()
    try:
        cp = booted.host("cp", ADDRESSES["cp"], binary)
        token = cp.init_server(host=ADDRESSES["cp"])
        cp.join(token, url=f"https://{ADDRESSES['cp']}:7710")
        nodes = {name: booted.host(name, ADDRESSES[name], binary) for name in ("n1", "n2")}
        for node in nodes.values():
            node.start_agent()
            node.join(cp.token(), server=cp, url=f"https://{ADDRESSES['cp']}:7710")
        cp.llmgw("node", "cordon", "cp")
        cp.serve_model(replicas=1)
        key = str(cp.llmgw("key", "create", "slurm-test", "--json")["key"])
        cp.llmgw("slurm", "setup", "--controller", "cp", "--nodes", "n1,n2")
        outside = booted.host("out", OUTSIDE, binary)  # llmgw installed, never started
        yield SlurmCluster(cp, nodes, key, outside)
    finally:
        booted.close()


def _drained_by_llmgw(cluster: SlurmCluster, node: str) -> bool:
    state, reason = cluster.sinfo().get(node, ("", ""))
    return state.startswith("drain") and reason.startswith(NOT_LENT)


def test_lend_and_reclaim_on_real_slurm(slurm: SlurmCluster) -> None:
    started = time.monotonic()
    slurm.wait(lambda: all(_drained_by_llmgw(slurm, n) for n in ("n1", "n2")),
               "slurmctld on cp, slurmd on n1 and n2, both drained by llmgw", 240)  # fmt: skip
    setup_s = time.monotonic() - started

    # Slurm's ports answer the cluster's hosts alone: slurmctld's 6817 on cp and slurmd's
    # 6818 on n1 from n2, not from a host on the same lan outside the cluster.
    for host, port in ((ADDRESSES["cp"], 6817), (ADDRESSES["n1"], 6818)):
        # (slurmd restarts once more when the last node enters slurm.conf: wait it out)
        slurm.wait(lambda: probe(slurm.nodes["n2"].ps, host, port) == "open",  # noqa: B023
                   f"{host}:{port} open to n2", 60)  # fmt: skip
    assert probe(slurm.outside.ps, ADDRESSES["cp"], 6817) == "dropped"
    assert probe(slurm.outside.ps, ADDRESSES["n1"], 6818) == "dropped"
    where = slurm.replica_nodes()
    assert len(where) == 1, where
    lent = where[0]
    other = "n2" if lent == "n1" else "n1"

    # Lend the node with the replica: the replica starts on the other node first; /v1 answers
    # throughout; then the node goes idle in Slurm and takes jobs.
    slurm.cp.llmgw("slurm", "lend", lent)
    answered = 0
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and slurm.state(lent) != "idle":
        assert slurm.chat(), "a chat while the node is lent"
        answered += 1
        time.sleep(1)
    assert slurm.state(lent) == "idle", slurm.sinfo()
    assert slurm.replica_nodes() == [other]
    assert slurm.chat()
    r = slurm.cp.ps.run(["srun", "-N1", "-w", lent, "hostname"], timeout=60)
    assert r.stdout.strip() == lent

    # Reclaim while a job runs: no new job lands there, the running one ends on its own,
    # then the node takes llmgw replicas again.
    job = slurm.sbatch(lent, 45, "reclaimed")
    slurm.wait(lambda: slurm.job_state(job) == "RUNNING", f"job {job} running on {lent}", 60)
    slurm.cp.llmgw("slurm", "reclaim", lent)
    slurm.wait(lambda: slurm.state(lent).startswith("drain"), f"{lent} draining in Slurm", 60)
    slurm.wait(lambda: slurm.node_status(lent)["status"].startswith("reclaiming"),
               f"{lent} reclaiming in llmgw", 30)  # fmt: skip
    assert slurm.job_state(job) == "RUNNING"  # not killed
    slurm.wait(lambda: slurm.job_state(job) == "COMPLETED", f"job {job} completed", 120)
    assert slurm.nodes[lent].ps.read_file("/tmp/reclaimed.done").strip() == "done"
    slurm.wait(lambda: slurm.node_status(lent)["status"] == "in llmgw", f"{lent} back", 60)
    slurm.cp.llmgw("model", "serve", MODEL, "--replicas", "2")
    slurm.cp.wait_ready(2)
    assert slurm.replica_nodes() == ["n1", "n2"]
    print(f"\nslurm setup {setup_s:.0f}s; {answered} chats answered while {lent} was lent")


def test_an_admins_drain_survives_lend_and_reclaim(slurm: SlurmCluster) -> None:
    slurm.cp.llmgw("model", "serve", MODEL, "--replicas", "1")
    slurm.wait(lambda: all(_drained_by_llmgw(slurm, n) for n in ("n1", "n2")), "set up", 240)
    slurm.cp.ps.run(["scontrol", "update", "nodename=n2", "state=drain", "reason=disk swap"])
    slurm.cp.llmgw("slurm", "lend", "n1")
    slurm.cp.llmgw("slurm", "lend", "n2")
    slurm.wait(lambda: slurm.state("n1") == "idle", "n1 lent", 240)
    assert slurm.sinfo()["n2"] == ("drained", "disk swap"), slurm.sinfo()
    slurm.cp.llmgw("slurm", "reclaim", "n2")
    slurm.wait(lambda: slurm.node_status("n2")["status"] == "in llmgw", "n2 back", 120)
    assert slurm.sinfo()["n2"] == ("drained", "disk swap"), slurm.sinfo()

    # The control plane restarted with a job on a lent node: the job is not lost, and the
    # new leader's slurm.conf still lists the node.
    job = slurm.sbatch("n1", 25, "restarted")
    slurm.wait(lambda: slurm.job_state(job) == "RUNNING", f"job {job} running on n1", 60)
    slurm.cp.ps.systemctl("restart", "llmgwd.service")
    slurm.cp.ps.wait_active("llmgwd.service", timeout=60)
    slurm.wait(lambda: "n1" in slurm.cp.connected(), "n1 connected again", 120)
    time.sleep(5)  # the new leader's first pass over Slurm
    assert "NodeName=n1 " in slurm.cp.ps.read_file("/etc/slurm/slurm.conf")
    assert slurm.job_state(job) in ("RUNNING", "COMPLETED")
    slurm.wait(lambda: slurm.job_state(job) == "COMPLETED", f"job {job} completed", 120)
    assert slurm.nodes["n1"].ps.read_file("/tmp/restarted.done").strip() == "done"
