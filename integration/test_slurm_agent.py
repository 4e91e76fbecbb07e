"""The agent's Slurm keeper on real Slurm (Debian's 22.05.8) in one private systemd host: its
drop-ins run slurmctld and slurmd, it keeps the node drained until lent, reports the jobs
running there, never lifts an administrator's drain, and undoes it all when told no part.
The keeper is driven inside the host (a fresh process each step, as after an agent restart);
integration/test_slurm.py runs the whole cluster."""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

import msgspec

from integration.harness import MakeLan, MakeSystemd, PrivateSystemd
from integration.llmgw_node import VENV
from llmgw.wire import SLURM_NOT_LENT, SlurmPart

N1 = "10.231.0.11"
# This machine's cgroups are v1 (no cgroup/v2 for slurmd): processes tracked by linuxproc.
CONF = f"""# Made by llmgw (test)
ClusterName=llmgw
SlurmctldHost=n1({N1})
SlurmctldParameters=enable_configless
AuthType=auth/munge
SlurmUser=slurm
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MailProg=/bin/true
ReturnToService=2
NodeName=n1 NodeAddr={N1} CPUs=2 State=DRAIN Reason="{SLURM_NOT_LENT}"
PartitionName=llmgw Nodes=n1 Default=YES MaxTime=INFINITE State=UP
"""
# One step of the keeper with the part in argv[1] (JSON, "null": none); prints its report.
STEP = """
import asyncio, sys, msgspec
from pathlib import Path
from llmgw.wire import SlurmPart
from llmgw_agentd.slurm.keeper import Keeper, Paths
from llmgw_agentd.slurm.setup_unit import SetupUnit
from llmgw_agentd.systemd import Systemd
async def main():
    sd = Systemd(); await sd.connect()
    k = Keeper("n1", sd, lambda on, peers: None, SetupUnit(sd, Path("/var/lib/t")),
               Paths(record=Path("/var/lib/t/rec.json")))
    k.set(msgspec.json.decode(sys.argv[1], type=SlurmPart | None))
    await k.step()
    print(msgspec.json.encode(k.report).decode())
asyncio.run(main())
"""


def step(ps: PrivateSystemd, part: SlurmPart | None) -> dict[str, Any]:
    r = ps.run([str(VENV / "bin/python"), "-c", STEP, msgspec.json.encode(part).decode()])
    return dict(json.loads(r.stdout.strip().splitlines()[-1]) or {})


def until(
    ps: PrivateSystemd, part: SlurmPart | None, want: dict[str, Any], s: float = 60
) -> dict[str, Any]:
    """Step the keeper until its report has want's fields (the node registers in seconds)."""
    deadline = time.monotonic() + s
    got: dict[str, Any] = {}
    while time.monotonic() < deadline:
        got = step(ps, part)
        if all(got.get(k) == v for k, v in want.items()):
            return got
        time.sleep(1)
    raise AssertionError(f"wanted {want}, the last report: {got}\n{ps.journal(lines=40)}")


def sinfo(ps: PrivateSystemd) -> str:
    return str(ps.run(["sinfo", "-h", "-N", "-o", "%N|%T|%E"]).stdout.strip())


def test_the_keeper_runs_slurm_lends_and_undoes(
    make_systemd: MakeSystemd, make_lan: MakeLan
) -> None:
    lan = make_lan("slurm")
    ps = make_systemd("n1", net=True, hostname="n1")
    lan.attach(ps, 11)
    key = base64.b64encode(os.urandom(1024)).decode()
    part = SlurmPart(
        slurmd=True, slurmctld=True, conf_server=f"{N1}:6817", munge_key=key,
        cluster_name="llmgw", slurm_conf=CONF, cgroup_conf="CgroupPlugin=autodetect\n",
        conf_hash="c1",
    )  # fmt: skip

    got = until(ps, part, {"state": "drained", "reason": SLURM_NOT_LENT})
    assert got["version"] == "22.05.8" and got["node_line"].startswith("NodeName=")
    for unit in ("munge", "slurmctld", "slurmd"):
        assert ps.systemctl("is-active", unit).stdout.strip() == "active"
    assert "-N n1" in ps.read_file("/run/systemd/system/slurmd.service.d/50-llmgw.conf")
    assert sinfo(ps) == f"n1|drained|{SLURM_NOT_LENT}"

    lent = msgspec.structs.replace(part, lent=["n1"])
    until(ps, lent, {"state": "idle", "reason": ""})
    job = ps.run(["sbatch", "--parsable", "--wrap", "sleep 5"]).stdout.strip()
    until(ps, lent, {"jobs": [job]}, s=30)
    until(ps, lent, {"jobs": []}, s=30)  # it ended: no job is reported

    ps.run(["scontrol", "update", "nodename=n1", "state=drain", "reason=admin"])
    got = step(ps, lent)
    assert (got["state"], got["reason"]) == ("drained", "admin")  # lent, yet not lifted
    assert sinfo(ps) == "n1|drained|admin"

    assert step(ps, None) == {}
    for unit in ("slurmctld", "slurmd"):
        assert ps.systemctl("is-active", unit, check=False).stdout.strip() == "inactive"
    assert ps.run("ls /run/systemd/system/ | grep -c slurm || true").stdout.strip() == "0"
    assert ps.run(["test", "-e", "/etc/slurm/slurm.conf"], check=False).returncode == 1
