"""The files Slurm runs on, as the leader makes them: slurm.conf from recorded `slurmd -C`
output, gres.conf from NVML inventories, cgroup.conf, the munge key, the kept node list."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from llmgw.wire import Gpu, Inventory
from llmgwd.planes.fence import Fenced, FencedStore
from llmgwd.planes.leader import LEADER
from llmgwd.slurm import kept
from llmgwd.slurm.cgroup import cgroup_conf
from llmgwd.slurm.conf import SlurmNode, hardware, slurm_conf
from llmgwd.slurm.gres import gres_conf
from llmgwd.slurm.munge import munge_key
from llmgwd.slurm.settings import SlurmSettings
from llmgwd.store.sqlite import SqliteStore

# Recorded on the build host with Debian's slurmd 22.05.8 (see the file's first line).
RECORDED = (Path(__file__).parent / "recorded" / "slurmd-C.txt").read_text().splitlines()
LINE = next(line for line in RECORDED if line.startswith("NodeName="))
SETTINGS = SlurmSettings(enabled=True, controller="cp1", nodes=["n2", "n1"], lent=["n1"])


def _gpu(index: int, minor: int = -1, mig: bool = False) -> Gpu:
    return Gpu(
        index, f"GPU-{index}", "NVIDIA H100", 80 << 30, 80 << 30, "9.0", mig=mig, minor=minor
    )


def test_the_recorded_line_gives_the_machine_not_its_host_name() -> None:
    words = hardware(LINE)
    assert words[0].startswith("CPUs=") and any(w.startswith("RealMemory=") for w in words)
    assert not any(w.startswith(("NodeName=", "UpTime=")) for w in words)
    with pytest.raises(ValueError, match="not a slurmd -C line"):
        hardware("UpTime=0-07:46:32")


def test_slurm_conf_lists_every_node_drained_and_is_the_same_whoever_is_lent() -> None:
    nodes = [SlurmNode("n2", "10.0.0.2", LINE, gpus=2), SlurmNode("n1", "10.0.0.1", LINE)]

    text = slurm_conf(SETTINGS, "10.0.0.9", nodes)

    lines = text.splitlines()
    assert "SlurmctldHost=cp1(10.0.0.9)" in lines
    assert "SlurmctldParameters=enable_configless" in lines
    assert "GresTypes=gpu" in lines and "ClusterName=llmgw" in lines
    # Backfill looks every 10 s (a job its main pass left pending waits no longer).
    assert "SchedulerType=sched/backfill" in lines
    assert "SchedulerParameters=bf_interval=10" in lines
    n1 = next(x for x in lines if x.startswith("NodeName=n1 "))
    n2 = next(x for x in lines if x.startswith("NodeName=n2 "))
    assert "NodeAddr=10.0.0.1" in n1 and "State=DRAIN" in n1
    assert "Gres=gpu:2" in n2 and "State=DRAIN" in n2 and "Reason=" in n2
    # Lending is the controller's agent's resume: the file does not change (no restart).
    unlent = msgspec.structs.replace(SETTINGS, lent=[])
    assert slurm_conf(unlent, "10.0.0.9", nodes) == text
    assert " ".join(hardware(LINE)) in n1
    assert lines[-1].startswith("PartitionName=llmgw Nodes=n1,n2 Default=YES")
    assert slurm_conf(SETTINGS, "10.0.0.9", nodes[::-1]) == text  # the same whatever order


def test_gres_conf_names_each_card_by_its_device_file_and_skips_mig_cards() -> None:
    invs = {
        "n1": Inventory(2, 1 << 30, 1 << 30, gpus=[_gpu(1, minor=3), _gpu(0, minor=2)]),
        "n2": Inventory(2, 1 << 30, 1 << 30, gpus=[_gpu(0), _gpu(1, mig=True)]),
        "n3": Inventory(2, 1 << 30, 1 << 30),
    }

    lines = gres_conf(invs).splitlines()[1:]

    assert lines == [
        "NodeName=n1 Name=gpu File=/dev/nvidia2",
        "NodeName=n1 Name=gpu File=/dev/nvidia3",
        "NodeName=n2 Name=gpu File=/dev/nvidia0",
    ]


def test_cgroup_conf_is_for_cgroup_v2() -> None:
    assert "CgroupPlugin=cgroup/v2" in cgroup_conf().splitlines()


def test_the_munge_key_is_the_secrets_own_and_not_the_secret() -> None:
    key = munge_key(b"s" * 32)
    assert len(key) == 1024 and key == munge_key(b"s" * 32)
    assert key != munge_key(b"t" * 32) and b"s" * 32 not in key


def test_a_node_with_a_job_stays_listed_after_the_settings_drop_it() -> None:
    n1, n2 = SlurmNode("n1", "a1", LINE), SlurmNode("n2", "a2", LINE)
    before = kept.Kept("10.0.0.9", [n1, n2], "cp1")
    fewer = SlurmSettings(controller="cp1", nodes=["n1"])

    assert kept.next_kept(before, fewer, {}, {"n2"}, "").nodes == [n1, n2]
    assert kept.next_kept(before, fewer, {}, set(), "").nodes == [n1]


def test_a_new_leader_lists_the_kept_nodes_until_they_report() -> None:
    n1 = SlurmNode("n1", "a1", LINE)
    new_n1 = SlurmNode("n1", "a1-new", LINE, gpus=1)
    before = kept.Kept("10.0.0.9", [n1], "cp1")
    s = SlurmSettings(controller="cp1", nodes=["n1", "n3"])

    assert kept.next_kept(before, s, {}, set(), "") == before  # n3 not known yet
    assert kept.next_kept(before, s, {"n1": new_n1}, set(), "").nodes == [new_n1]


def test_the_kept_address_is_not_taken_for_another_controller() -> None:
    before = kept.Kept("10.0.0.9", [], "cp1")
    moved = SlurmSettings(controller="cp2", nodes=["n1"])

    assert kept.next_kept(before, moved, {}, set(), "").controller_address == ""
    assert kept.next_kept(before, moved, {}, set(), "10.0.0.7").controller_address == "10.0.0.7"


async def test_the_kept_list_is_written_only_within_the_leaders_term() -> None:
    store = await SqliteStore.open(":memory:")
    term = await store.put(LEADER, b"me")
    stepped: list[str] = []
    k = kept.Kept("10.0.0.9", [SlurmNode("n1", "a1", LINE)])

    await kept.save(FencedStore(store, term, stepped.append), k)
    assert await kept.load(store) == k
    await store.delete(LEADER)
    await store.put(LEADER, b"other")
    with pytest.raises(Fenced):
        await kept.save(FencedStore(store, term, stepped.append), kept.Kept())
    assert await kept.load(store) == k and len(stepped) == 1
    await store.close()


def test_jobs_are_tracked_in_cgroups_unless_a_node_has_v1_cgroups() -> None:
    v2 = [SlurmNode("n1", "a1", LINE, cgroup="v2"), SlurmNode("n2", "a2", LINE)]
    text = slurm_conf(SETTINGS, "10.0.0.9", v2)
    assert "ProctrackType=proctrack/cgroup" in text.splitlines()
    assert "CgroupPlugin=cgroup/v2" in cgroup_conf(True)

    # This build host's cgroups are hybrid: slurmd 22.05.8 exits "Hybrid mode is not
    # supported" under cgroup/v2 (seen in integration/test_slurm_agent.py's host).
    mixed = [*v2, SlurmNode("n3", "a3", LINE, cgroup="v1")]
    lines = slurm_conf(SETTINGS, "10.0.0.9", mixed).splitlines()
    assert "ProctrackType=proctrack/linuxproc" in lines and "TaskPlugin=task/affinity" in lines
    assert "CgroupPlugin=autodetect" in cgroup_conf(False).splitlines()


def test_a_job_asking_no_memory_gets_the_smallest_nodes_share_per_cpu() -> None:
    shape = "Boards=1 SocketsPerBoard=1 ThreadsPerCore=1"
    small = f"NodeName=x CPUs=4 {shape} CoresPerSocket=4 RealMemory=8000"
    big = f"NodeName=y CPUs=8 {shape} CoresPerSocket=8 RealMemory=64000"
    nodes = [SlurmNode("n1", "a1", small), SlurmNode("n2", "a2", big)]
    assert "DefMemPerCPU=2000" in slurm_conf(SETTINGS, "10.0.0.9", nodes).splitlines()
    assert "DefMemPerCPU" not in slurm_conf(SETTINGS, "10.0.0.9", [])
