"""Each engine held to its placement on a real systemd 252: its unit's MemoryMax, MemoryHigh,
AllowedCPUs, DevicePolicy and DeviceAllow as `systemctl show` tells them, llama-server serving
on CPUs behind DevicePolicy=closed, and an engine pushed past its MemoryMax reported as OOM."""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from integration.harness import REPO, PrivateSystemd
from integration.llmgw_node import MODEL, VENV, Node, serving
from llmgw import engine_memory
from llmgw_agentd import cpus

CLIENT_PORT, CLUSTER_PORT = 17760, 17770
RECORDS = "/var/lib/llmgw-agent/engines"


def llama_server() -> str:
    r = subprocess.run([REPO / "scripts/build-llama-server"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"llama-server could not be built here: {r.stderr[-500:]}")
    return r.stdout.strip()


@pytest.fixture(scope="module")
def node(systemd: PrivateSystemd) -> Iterator[Node]:
    yield serving(systemd, llama_server(), CLIENT_PORT, CLUSTER_PORT)


def show(ps: PrivateSystemd, unit: str, *props: str) -> dict[str, str]:
    """`systemctl show -p ...` of a unit, as a dict (a property it prints on several lines,
    as DeviceAllow, has them joined by newlines)."""
    out = ps.systemctl("show", unit, *(f"--property={p}" for p in props)).stdout
    got: dict[str, str] = {}
    for line in out.splitlines():
        name, eq, value = line.partition("=")
        if eq:
            got[name] = f"{got[name]}\n{value}" if name in got else value
    return got


def record(ps: PrivateSystemd, unit: str) -> dict[str, Any]:
    """The agent's record of an engine: its spec (no key) and the CPUs it picked."""
    rid = unit.removeprefix("llmgw-engine-").removesuffix(".service")
    found: dict[str, Any] = json.loads(ps.read_file(f"{RECORDS}/{rid}.json"))
    return found


def agent_status(ps: PrivateSystemd) -> list[dict[str, Any]]:
    """The agent's own report of its replicas (its local socket)."""
    out = ps.run(["curl", "-s", "--unix-socket", "/run/llmgw/agentd.sock",
                  "http://agent/api/v1/status"]).stdout  # fmt: skip
    replicas: list[dict[str, Any]] = json.loads(out)["replicas"]
    return replicas


def test_a_cpu_engines_unit_matches_its_placement_and_serves(node: Node) -> None:
    (unit,) = node.engine_units()
    got = show(node.ps, unit, "MemoryMax", "MemoryHigh", "AllowedCPUs", "CPUAffinity",
               "DevicePolicy", "DeviceAllow", "MainPID")  # fmt: skip
    rec = record(node.ps, unit)
    spec = rec["spec"]
    assert spec["cores"] == 1 and len(rec["cpus"]) == 1  # the default profile: a core each
    assert int(got["MemoryMax"]) == spec["memory_max_bytes"] > 0
    assert int(got["MemoryHigh"]) == engine_memory.high(spec["memory_max_bytes"])
    assert got["AllowedCPUs"] == got["CPUAffinity"] == cpus.cpu_list(rec["cpus"])
    # ProtectClock= adds its own read-only /dev/rtc entry; no other device.
    assert got["DevicePolicy"] == "closed" and got["DeviceAllow"] == "char-rtc r"
    # The kernel holds every thread of the engine to that CPU (CPUAffinity: any cgroup version).
    status = node.ps.run(["cat", f"/proc/{got['MainPID']}/status"]).stdout
    allowed = next(line for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
    assert allowed.split()[-1] == cpus.cpu_list(rec["cpus"])
    # llama-server on CPUs needs no device beyond what DevicePolicy=closed leaves it.
    client = openai.OpenAI(base_url=node.base_url, api_key=node.key, max_retries=0, timeout=120)
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=8
    )
    assert answer.choices[0].message.content


def test_an_engine_pushed_past_its_memory_max_is_reported_as_oom(node: Node) -> None:
    (unit,) = node.engine_units()
    before = int(show(node.ps, unit, "MemoryMax")["MemoryMax"])
    rid = unit.removeprefix("llmgw-engine-").removesuffix(".service")
    # The test's hook: a runtime drop-in holds the engine's next start to 32 MiB, less than
    # its KV cache alone; the engine killed, its agent starts it again under that limit.
    dropin = f"/run/systemd/system.control/{unit}.d/90-tiny.conf"
    node.ps.write_file(dropin, "[Service]\nMemoryMax=32M\n")
    node.ps.systemctl("daemon-reload")
    node.ps.systemctl("kill", "--signal=SIGKILL", unit)
    try:
        node.wait(
            lambda: any(r["id"] == rid and r["oom_kills"] >= 1 for r in agent_status(node.ps)),
            "the engine reported killed over its memory limit",
            timeout=120,
        )
        (mine,) = [r for r in agent_status(node.ps) if r["id"] == rid]
        assert mine["reason"] == "oom", mine
        seen = [r for m in node.llmgw("models", "--json") for r in m["replica_status"]]
        print("llmgw models:", seen)
    finally:
        node.ps.run(["rm", "-f", dropin])
        node.ps.systemctl("daemon-reload")
    # The control plane learnt: the engine comes back with a larger MemoryMax, and serves.
    node.wait(
        lambda: (
            int(show(node.ps, unit, "MemoryMax")["MemoryMax"]) > before
            and node.model()["ready"] >= 1
        ),
        "the engine ready again under a larger limit",
        timeout=180,
    )
    after = int(show(node.ps, unit, "MemoryMax")["MemoryMax"])
    print(f"{unit}: MemoryMax {before >> 20} MiB, after the OOM kill {after >> 20} MiB")


AGENT_ON_CARDS = """
    import asyncio, sys
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from llmgw.config import AgentConfig, Engines, LlamaCpp
    from llmgw.wire import ReplicaSpec
    from llmgw_agentd.replicas import Replicas
    from llmgw_agentd.systemd import Systemd
    from tests.llmgw_agentd.nvml_inventory import load, recorded

    inv = recorded(load("dgx-h100-8x80gb"), toolkit="12.4")

    async def main() -> None:
        r = Replicas(
            # The site's own llama-server (no CUDA build here: nvcc but no cuBLAS), which the
            # agent takes as it is instead of building one for the cards first.
            AgentConfig(state_dir="/tmp/cards/state", port_range=(21000, 21099),
                        engines=Engines(llama_cpp=LlamaCpp(binary="/bin/sleep"))),
            runtime_dir=Path("/tmp/cards/run"), inventory=lambda: inv,
            command=lambda s, h, p, k: ["/bin/sleep", "600"], online_cpus=lambda: [0, 1],
        )
        await r.start()
        spec = ReplicaSpec(
            id="cards", model="m", engine="llama.cpp", source="file:/m.gguf",
            devices=[inv.gpus[2].uuid, inv.gpus[5].uuid], cores=2, memory_max_bytes=1 << 30,
        )
        await r.apply([spec])
        sd = Systemd()
        await sd.connect()
        while (await sd.state("llmgw-engine-cards.service")).active_state != "active":
            if r.statuses()[0].state == "failed":
                break
            await asyncio.sleep(0.1)
        print(r.statuses()[0])
        await sd.close()
        await r.close()

    asyncio.run(main())
"""


def test_an_engine_on_cards_may_open_exactly_its_cards(node: Node) -> None:
    # No card here: the agent's own code, with the cards NVML answered on a DGX H100, starts a
    # unit in this systemd 252, and systemd says what it took. (That second agent stops the
    # node's agent's engine, which it has no record of: the last test of the module.)
    script = textwrap.dedent(AGENT_ON_CARDS).format(repo=str(REPO))
    out = node.ps.run([str(VENV / "bin/python"), "-c", script], timeout=60)
    unit = "llmgw-engine-cards.service"
    try:
        got = show(node.ps, unit, "DevicePolicy", "DeviceAllow", "AllowedCPUs", "MemoryMax",
                   "MemoryHigh", "Environment", "ActiveState")  # fmt: skip
        print(out.stdout, got)
        assert got["DevicePolicy"] == "closed"
        assert set(got["DeviceAllow"].splitlines()) == {
            "char-rtc r",  # ProtectClock='s
            "/dev/nvidia2 rw", "/dev/nvidia5 rw", "/dev/nvidiactl rw", "/dev/nvidia-uvm rw",
            "/dev/nvidia-uvm-tools rw",
        }  # fmt: skip
        assert got["AllowedCPUs"] == "0-1"
        assert int(got["MemoryMax"]) == 1 << 30
        assert int(got["MemoryHigh"]) == engine_memory.high(1 << 30) == 921 << 20
        assert "CUDA_VISIBLE_DEVICES=GPU-" in got["Environment"]
    finally:
        node.ps.systemctl("stop", unit, check=False)
        node.wait_ready(1)
