"""Slurm sharing under faults (issue 32), on Debian's real Slurm 22.05 in private systemds
(the three hosts of test_slurm.py): no llmgw engine beside a running job, no controller
stopped by a restart, no /v1 request lost while a node is lent."""

from __future__ import annotations

import time

from integration.llmgw_node import MODEL
from integration.steady import Stream
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
PROBE = ("date +%s.%N > /tmp/{tag}.job; pgrep -c -f llmgw/llama-server >> /tmp/{tag}.job; "
         "systemctl list-units --plain --no-legend 'llmgw-engine-*' >> /tmp/{tag}.job")  # fmt: skip


def n2_stream(cluster: SlurmCluster) -> Stream:
    """chat_stream.py on n2's host, two clients through cp's /v1."""
    url = f"http://{ADDRESSES['cp']}:7700/v1"
    return Stream(cluster.key, [url], inside=cluster.nodes["n2"].ps.nsenter())


def _deafen(cluster: SlurmCluster, node: str) -> str:
    """node's engine restarted under DEAF (the agent restarts the one killed); its unit."""
    host = cluster.nodes[node]
    host.ps.run(["mv", BINARY, BINARY + ".real"])
    host.ps.write_file(BINARY, DEAF, mode=0o755)
    (unit,) = host.engine_units()
    host.ps.systemctl("kill", "-s", "KILL", unit)
    cluster.wait(lambda: _exe(cluster, node, unit).endswith(("sh", "dash"))
                 and cluster.replica_nodes() == [node],
                 f"{node}'s engine again, under a shell deaf to SIGTERM", 120)  # fmt: skip
    return str(unit)


def _sbatch(cluster: SlurmCluster, node: str, script: str) -> str:
    """A batch job of script on node; its id."""
    r = cluster.cp.ps.run(["sbatch", "--parsable", "-w", node, "-D", "/tmp", "-o", "/dev/null",
                           "--wrap", script], timeout=30)  # fmt: skip
    return str(r.stdout.strip().split(";")[0])


def _exe(cluster: SlurmCluster, node: str, unit: str) -> str:
    """The program the unit's main process runs (a script's comm is the script's name)."""
    pid = cluster.nodes[node].main_pid(unit)
    r = cluster.nodes[node].ps.run(["readlink", f"/proc/{pid}/exe"], check=False)
    return r.stdout.strip() if pid else ""


def test_a_lend_waits_for_an_engine_deaf_to_sigterm(slurm: SlurmCluster) -> None:
    """Lending the node of a ready replica whose engine ignores SIGTERM, under steady /v1
    load: no request fails, and the job sent to the node starts only once the engine's unit
    is gone (killed stop_timeout_s after its SIGTERM)."""
    slurm.cp.llmgw("model", "serve", MODEL, "--replicas", "1")
    slurm.wait(lambda: all(_drained_by_llmgw(slurm, n) for n in ("n1", "n2"))
               and len(slurm.replica_nodes()) == 1, "set up, one replica ready", 240)  # fmt: skip
    (lent,) = slurm.replica_nodes()
    host, tag, lend_at = slurm.nodes[lent], "deaf", 0.0
    try:
        unit = _deafen(slurm, lent)
        with n2_stream(slurm) as stream:
            time.sleep(3)  # the stream under way
            lend_at = time.time()
            slurm.cp.llmgw("slurm", "lend", lent)
            job = _sbatch(slurm, lent, PROBE.format(tag=tag))
            stopping_at = gone_at = 0.0
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and slurm.job_state(job) != "COMPLETED":
                states = [r["state"] for r in slurm.cp.model(MODEL)["replica_status"]]
                stopping_at = stopping_at or (time.time() if "stopping" in states else 0.0)
                if not gone_at and unit not in host.engine_units():
                    gone_at = time.time()
                time.sleep(0.5)
            time.sleep(3)  # the stream goes on after the lend
        assert slurm.job_state(job) == "COMPLETED", slurm.journals()
        said = host.ps.read_file(f"/tmp/{tag}.job").splitlines()
        print(f"\nfrom the lend: replica stopping at {stopping_at - lend_at:.1f}s, {unit} gone "
              f"at {gone_at - lend_at:.1f}s, the job started at {float(said[0]) - lend_at:.1f}s; "
              f"{len(stream.rows)} /v1 requests, {len(stream.failures())} failed")  # fmt: skip
        # No engine of llmgw's on the node when the job started there.
        assert said[1:] == ["0"], said
        assert stream.rows and not stream.failures(), stream.failures()[:3]
        journal = host.ps.journal(unit, 30)
        assert "Killing" in journal or "SIGKILL" in journal, journal  # deaf: killed at the bound
    finally:
        host.ps.run(["mv", "-f", BINARY + ".real", BINARY], check=False)
        if lend_at:
            slurm.cp.llmgw("slurm", "reclaim", lent)
            slurm.wait(lambda: slurm.node_status(lent)["status"] == "in llmgw", "back", 120)


# Faults 1 and 2: an agent restarted while its node is taken back, llmgwd killed -9.

SLURM_UNITS = ("munge.service", "slurmctld.service", "slurmd.service")


def _one_replica_and_both_in_llmgw(cluster: SlurmCluster) -> tuple[str, str]:
    """Slurm set up, n1 and n2 in llmgw, one replica: (the node with it, the other)."""
    cluster.cp.llmgw("model", "serve", MODEL, "--replicas", "1")
    cluster.wait(lambda: all(_drained_by_llmgw(cluster, n) for n in ("n1", "n2")),
                 "slurmctld on cp, slurmd on n1 and n2, both drained by llmgw", 240)  # fmt: skip
    cluster.wait(lambda: len(cluster.replica_nodes()) == 1, "one replica ready", 180)
    where = cluster.replica_nodes()[0]
    return where, "n2" if where == "n1" else "n1"


def _lend_with_a_job(cluster: SlurmCluster, node: str, seconds: int, tag: str) -> str:
    """Lend node (it has no replica), run a job of seconds there; its id once running."""
    cluster.cp.llmgw("slurm", "lend", node)
    cluster.wait(lambda: cluster.state(node) == "idle", f"{node} lent, idle in Slurm", 120)
    job = cluster.sbatch(node, seconds, tag)
    cluster.wait(lambda: cluster.job_state(job) == "RUNNING", f"job {job} on {node}", 60)
    return job


def _all_back(cluster: SlurmCluster) -> bool:
    """Whether cp, n1 and n2 are connected to the (restarted) llmgwd."""
    try:
        return sorted(cluster.cp.connected()) == ["cp", "n1", "n2"]
    except Exception:  # llmgwd starting: ask again
        return False


def _undone(cluster: SlurmCluster) -> int:
    """How often cp's agent said it stopped a Slurm unit or removed Slurm's files."""
    journal = cluster.cp.ps.journal("llmgw-agentd.service", 2000)
    return journal.count("no such part") + journal.count("removed what llmgw wrote")


def _engines(cluster: SlurmCluster, node: str) -> list[str]:
    """llmgw's engine units on node (running or stopping), as its systemd lists them."""
    return cluster.nodes[node].engine_units()


def test_an_agent_restart_keeps_a_node_taken_back_held(slurm: SlurmCluster) -> None:
    _, node = _one_replica_and_both_in_llmgw(slurm)
    job = _lend_with_a_job(slurm, node, 60, "agent-restart")
    slurm.cp.llmgw("slurm", "reclaim", node)
    slurm.wait(lambda: slurm.node_status(node)["status"].startswith("reclaiming"),
               f"{node} reclaiming in llmgw", 60)  # fmt: skip

    # The node's agent killed -9 (systemd starts it again), then a second replica asked for:
    # while the job runs, no engine of llmgw's starts on the node.
    agent = slurm.nodes[node]
    before = agent.main_pid("llmgw-agentd.service")
    agent.ps.systemctl("kill", "--signal=KILL", "llmgw-agentd.service")
    slurm.wait(lambda: agent.main_pid("llmgw-agentd.service") not in (0, before),
               f"{node}'s agent started again", 60)  # fmt: skip
    slurm.wait(lambda: node in slurm.cp.connected(), f"{node} connected again", 60)
    slurm.cp.llmgw("model", "serve", MODEL, "--replicas", "2")
    looks = 0
    while slurm.job_state(job) == "RUNNING":
        engines, status = _engines(slurm, node), slurm.node_status(node)["status"]
        assert engines == [], f"{engines} on {node} while job {job} runs there ({status})"
        assert status.startswith("reclaiming"), status
        looks += 1
        time.sleep(1)
    assert slurm.job_state(job) == "COMPLETED"
    assert agent.ps.read_file("/tmp/agent-restart.done").strip() == "done"

    # The job done, the node is llmgw's again (the second replica went to the other node).
    slurm.wait(lambda: slurm.node_status(node)["status"] == "in llmgw", f"{node} back", 120)
    slurm.cp.wait_ready(2)
    print(f"\n{looks} looks at {node} while job {job} ran: no llmgw engine there")


def test_a_killed_llmgwd_stops_no_slurm_daemon(slurm: SlurmCluster) -> None:
    _, node = _one_replica_and_both_in_llmgw(slurm)
    job = _lend_with_a_job(slurm, node, 45, "llmgwd-killed")
    hosts = {"cp": slurm.cp, **slurm.nodes}
    pids = {(h, u): n.main_pid(u) for h, n in hosts.items() for u in SLURM_UNITS
            if n.main_pid(u)}  # fmt: skip
    assert ("cp", "slurmctld.service") in pids and (node, "slurmd.service") in pids, pids
    killed, undone = slurm.cp.main_pid("llmgwd.service"), _undone(slurm)

    # llmgwd killed -9 on the control plane; systemd starts it again, and it leads again.
    slurm.cp.ps.systemctl("kill", "--signal=KILL", "llmgwd.service")
    slurm.wait(lambda: slurm.cp.main_pid("llmgwd.service") not in (0, killed),
               "llmgwd started again", 60)  # fmt: skip
    started = time.monotonic()
    lost: list[str] = []
    # Through the new leader's first 30 s (its agents back, its Slurm parts set): every
    # Slurm daemon keeps its PID, the controller its files, the lent node stays up.
    while time.monotonic() - started < 30 or not _all_back(slurm):
        now = {k: hosts[k[0]].main_pid(k[1]) for k in pids}
        lost += [
            f"{h} {u}: {pids[(h, u)]} -> {p}" for (h, u), p in now.items() if p != pids[(h, u)]
        ]
        r = slurm.cp.ps.run(["test", "-s", "/etc/slurm/slurm.conf"], check=False)
        lost += [] if r.returncode == 0 else ["/etc/slurm/slurm.conf gone"]
        state = slurm.state(node)
        lost += [f"{node} {state} in Slurm"] if state.startswith("drain") else []
        assert not lost, f"{lost}\n{slurm.journals()}"
        assert time.monotonic() - started < 180, "the agents did not come back"
        time.sleep(0.5)
    assert slurm.job_state(job) in ("RUNNING", "COMPLETED")
    slurm.wait(lambda: slurm.job_state(job) == "COMPLETED", f"job {job} completed", 120)
    assert slurm.nodes[node].ps.read_file("/tmp/llmgwd-killed.done").strip() == "done"
    assert _undone(slurm) == undone, slurm.cp.ps.journal("llmgw-agentd.service", 40)
    print(f"\nslurmctld's PID {pids[('cp', 'slurmctld.service')]} kept across llmgwd's kill -9")

    # The node taken back, so the next test finds both in llmgw.
    slurm.cp.llmgw("slurm", "reclaim", node)
    slurm.wait(lambda: slurm.node_status(node)["status"] == "in llmgw", f"{node} back", 120)
