"""Slurm's edges (issue 31) on Debian's real Slurm 22.05 in private systemds: with
slurm.all_nodes (`llmgw slurm setup --all-nodes`) a node that joins after the setup gets a
running slurmd, shows in sinfo drained by llmgw, and runs a job once lent; with no
controller's address known (the controller moved to a node not heard yet) the nodes are
told nothing, and the slurmd each runs is left running."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from integration.conftest import unavailable
from integration.cp_cluster import Booted
from integration.llmgw_node import llama_server
from integration.test_slurm import NOT_LENT, SlurmCluster, _drained_by_llmgw, pytestmark

__all__ = ["pytestmark"]  # skipped where Debian's slurmctld and slurmd are not installed

# A window long enough for an agent told "no part" to stop its slurmd (it does in seconds).
UNTOLD_WINDOW_S = 20
ADDRESSES = {"cp": "10.234.0.10", "n1": "10.234.0.11", "n2": "10.234.0.12"}
# LLMGW_EDGES_SETUP overrides the setup's node argument, to see the test fail without
# all_nodes (e.g. "--nodes=cp,n1").
SETUP = os.environ.get("LLMGW_EDGES_SETUP", "--all-nodes")


@pytest.fixture(scope="module")
def edges() -> Iterator[tuple[SlurmCluster, Booted, str]]:
    """cp (the Slurm controller) and n1 joined, Slurm set up with --all-nodes; n2 booted
    by the test, after the setup. No model is served."""
    why = unavailable()
    if why:
        pytest.skip(why)
    binary = llama_server()
    booted = Booted("slurm-edges", prefix="10.234.0")
    booted.lan.create()
    try:
        cp = booted.host("cp", ADDRESSES["cp"], binary)
        token = cp.init_server(host=ADDRESSES["cp"])
        cp.join(token, url=f"https://{ADDRESSES['cp']}:7710")
        n1 = booted.host("n1", ADDRESSES["n1"], binary)
        n1.start_agent()
        n1.join(cp.token(), server=cp, url=f"https://{ADDRESSES['cp']}:7710")
        cp.llmgw("slurm", "setup", "--controller", "cp", SETUP)
        # (no chats and no host outside the cluster here: key empty, outside is cp)
        yield SlurmCluster(cp, {"n1": n1}, "", cp), booted, binary
    finally:
        booted.close()


def test_a_node_joining_after_all_nodes_setup_runs_slurmd(
    edges: tuple[SlurmCluster, Booted, str],
) -> None:
    slurm, booted, binary = edges
    slurm.wait(lambda: _drained_by_llmgw(slurm, "n1"), "n1 in Slurm, drained by llmgw", 240)

    n2 = booted.host("n2", ADDRESSES["n2"], binary)
    slurm.nodes["n2"] = n2
    n2.start_agent()
    n2.join(slurm.cp.token(), server=slurm.cp, url=f"https://{ADDRESSES['cp']}:7710")
    slurm.wait(lambda: _drained_by_llmgw(slurm, "n2"),
               "n2, joined after the setup, in sinfo drained by llmgw", 180)  # fmt: skip
    # slurmd may still be restarting the moment sinfo first lists n2 (a start before the
    # controller knew it failed): active in the end is what a person checks.
    active = lambda: n2.ps.systemctl("is-active", "slurmd", check=False).stdout.strip() == "active"  # noqa: E731
    slurm.wait(active, "n2's slurmd active", 60)
    assert "NodeName=n2 " in slurm.cp.ps.read_file("/etc/slurm/slurm.conf")
    assert slurm.sinfo()["n2"][1].startswith(NOT_LENT)

    slurm.cp.llmgw("slurm", "lend", "n2")
    slurm.wait(lambda: slurm.state("n2") == "idle", "n2 lent, idle in Slurm", 120)
    r = slurm.cp.ps.run(["srun", "-N1", "-w", "n2", "hostname"], timeout=60)
    assert r.stdout.strip() == "n2"


def test_no_controller_known_leaves_slurmd_running(
    edges: tuple[SlurmCluster, Booted, str],
) -> None:
    slurm, _, _ = edges
    slurm.wait(lambda: _drained_by_llmgw(slurm, "n1"), "n1 in Slurm, drained by llmgw", 240)
    hosts = {"cp": slurm.cp, **slurm.nodes}

    def slurmd(node: str) -> str:
        return hosts[node].ps.systemctl("is-active", "slurmd", check=False).stdout.strip()

    def settled(node: str) -> bool:  # registered with slurmctld: drained by llmgw, or lent
        return _drained_by_llmgw(slurm, node) or slurm.state(node) == "idle"

    slurm.wait(lambda: all(settled(n) and slurmd(n) == "active" for n in hosts),
               "every node in Slurm, its slurmd running", 180)  # fmt: skip

    # The controller moved to a node that has not joined: no controller's address is known.
    slurm.cp.llmgw("slurm", "setup", "--controller", "n9", SETUP)
    try:
        end = time.monotonic() + UNTOLD_WINDOW_S
        while time.monotonic() < end:
            for name in hosts:
                active = slurmd(name)
                assert active == "active", f"{name}'s slurmd {active!r}, no controller known"
            time.sleep(1)
    finally:
        slurm.cp.llmgw("slurm", "setup", "--controller", "cp", SETUP)
