"""Replicas against a fake systemd: engines start, get ready, are restarted, stopped and adopted."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import msgspec
import pytest

from llmgw.config import AgentConfig, Engines
from llmgw.wire import Inventory, ReplicaSpec, ReplicaStatus
from llmgw_agentd.replicas import CommandBuilder, EngineRecord, Preparer, Replicas
from llmgw_agentd.systemd import Systemd
from tests.llmgw_agentd.fake_systemd import FakeSystemd, fake_systemd

FAKE_ENGINE = str(Path(__file__).with_name("fake_engine.py"))
KEY = "sk-test-0123456789"


def engine_command(spec: ReplicaSpec, host: str, port: int, key: str | None) -> list[str]:
    """The stand-in engine, with the spec's context and args (e.g. --parallel) passed on."""
    argv = [sys.executable, FAKE_ENGINE, "--host", host, "--port", str(port), *spec.args]
    argv += ["--ctx-size", str(spec.context)] if spec.context else []
    return argv + (["--api-key-file", key] if key else [])


async def ready_software(spec: ReplicaSpec, progress: Callable[[str], None]) -> None:
    """The engine's software is there already (nothing built, nothing installed)."""


def slow_command(spec: ReplicaSpec, host: str, port: int, key: str | None) -> list[str]:
    """The stand-in engine, loading for a while (an option llama-server would refuse)."""
    return [*engine_command(spec, host, port, key), "--load-s", "0.3"]


def spec(rid: str = "r1", **kw: object) -> ReplicaSpec:
    base: dict[str, object] = {
        "id": rid,
        "model": "smollm2",
        "engine": "llama.cpp",
        "source": "file:/models/m.gguf",
        "api_key": KEY,
    }
    base.update(kw)
    return ReplicaSpec(**base)  # type: ignore[arg-type]


class Node:
    """One agent's worth of setup on a shared fake systemd; new_replicas() is an agent (re)start."""

    def __init__(self, tmp: Path, address: str, fake: FakeSystemd) -> None:
        self.tmp, self.address, self.fake = tmp, address, fake
        self.config = AgentConfig(
            state_dir=str(tmp / "state"), address="127.0.0.1", port_range=(43100, 43199)
        )
        self.changes = 0
        self.made: list[Replicas] = []
        self.inventory = Inventory(cores=8, memory_bytes=16 << 30, memory_free_bytes=8 << 30)
        self.cpus = list(range(8))  # the CPU ids the agent may give engines
        self.kernel_ooms = 0  # the kernel's OOM kills so far, as /proc/vmstat would say

    def on_change(self) -> None:
        self.changes += 1

    async def new_replicas(
        self,
        command: CommandBuilder | None = engine_command,
        prepare: Preparer | None = ready_software,
    ) -> Replicas:
        """An agent (None: the agent's own command, or own building and installing)."""
        r = Replicas(
            self.config,
            bus_address=self.address,
            runtime_dir=self.tmp / "run",
            on_change=self.on_change,
            command=command,
            probe_interval=0.05,
            backoff=(0.1, 0.4),
            inventory=lambda: self.inventory,
            online_cpus=lambda: self.cpus,
            kernel_ooms=lambda: self.kernel_ooms,
            prepare=prepare,
        )
        await r.start()
        self.made.append(r)
        return r


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    async with fake_systemd(tmp_path) as (address, fake):
        n = Node(tmp_path, address, fake)
        try:
            yield n
        finally:
            for r in n.made:
                await r.close()


async def until(
    replicas: Replicas, pred: Callable[[dict[str, ReplicaStatus]], bool], within: float = 10
) -> dict[str, ReplicaStatus]:
    """Wait for the agent's reported statuses to satisfy pred."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        got = {s.id: s for s in replicas.statuses()}
        if pred(got):
            return got
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out; statuses: {got}")
        await asyncio.sleep(0.02)


def ready(rid: str = "r1") -> Callable[[dict[str, ReplicaStatus]], bool]:
    return lambda s: rid in s and s[rid].state == "ready"


async def get(port: int, path: str, key: str) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {key}"}
        ) as resp,
    ):
        return resp.status


async def test_an_engine_starts_and_becomes_ready(node: Node) -> None:
    replicas = await node.new_replicas(slow_command)
    await replicas.apply([spec()])
    first = await until(replicas, lambda s: "r1" in s)
    assert first["r1"].state == "starting"  # /health answers 503 while it loads
    got = (await until(replicas, ready()))["r1"]
    assert got.unit == "llmgw-engine-r1.service" and 43100 <= got.port <= 43199
    assert got.restarts == 0 and node.changes >= 2
    # The key reached the engine (as a credential) and nothing else.
    assert await get(got.port, "/v1/models", KEY) == 200
    assert await get(got.port, "/v1/models", "wrong") == 401
    key_file = node.tmp / "run" / "keys" / "r1.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    unit = node.fake.units["llmgw-engine-r1.service"]
    assert KEY not in repr(unit.properties)
    assert KEY not in (node.tmp / "state" / "engines" / "r1.json").read_text()


async def test_the_unit_is_sandboxed_and_left_to_the_agent_to_restart(node: Node) -> None:
    replicas = await node.new_replicas()
    await replicas.apply([spec()])
    await until(replicas, ready())
    props = node.fake.units["llmgw-engine-r1.service"].properties
    assert props["Slice"] == "llmgw-engines.slice"
    assert "smollm2" in props["Description"]
    assert "Restart" not in props  # the agent restarts it, counting
    assert props["DynamicUser"] is True and props["ProtectSystem"] == "strict"
    assert props["KillMode"] == "mixed" and props["StandardOutput"] == "journal"
    key_file = str(node.tmp / "run" / "keys" / "r1.key")
    assert [tuple(c) for c in props["LoadCredential"]] == [("key", key_file)]


async def test_a_killed_engine_is_reported_failed_then_restarted(node: Node) -> None:
    replicas = await node.new_replicas()
    await replicas.apply([spec()])
    port = (await until(replicas, ready()))["r1"].port
    old_pid = node.fake.units["llmgw-engine-r1.service"].pid
    node.fake.kill("llmgw-engine-r1.service")
    failed = (await until(replicas, lambda s: s["r1"].state == "failed", within=2))["r1"]
    assert "killed by signal SIGKILL" in failed.message
    back = (await until(replicas, lambda s: ready()(s) and s["r1"].restarts == 1))["r1"]
    assert back.port == port and back.message == ""
    assert node.fake.started == ["llmgw-engine-r1.service"] * 2
    assert node.fake.units["llmgw-engine-r1.service"].pid != old_pid
    assert await get(port, "/v1/models", KEY) == 200


async def test_an_engine_that_cannot_start_is_retried_with_backoff(node: Node) -> None:
    def broken(spec: ReplicaSpec, host: str, port: int, key: str | None) -> list[str]:
        return ["/nonexistent/llama-server", "--port", str(port)]

    replicas = Replicas(
        node.config,
        bus_address=node.address,
        runtime_dir=node.tmp / "run",
        command=broken,
        probe_interval=0.05,
        backoff=(0.05, 0.2),
    )
    await replicas.start()
    node.made.append(replicas)
    await replicas.apply([spec()])
    got = (await until(replicas, lambda s: s["r1"].restarts >= 2))["r1"]
    assert got.state == "failed" and "203/EXEC" in got.message


async def test_apply_stops_the_replicas_no_longer_wanted(node: Node) -> None:
    replicas = await node.new_replicas()
    await replicas.apply([spec("r1"), spec("r2")])
    got = await until(replicas, lambda s: ready("r1")(s) and ready("r2")(s))
    assert got["r1"].port != got["r2"].port
    r2_pid = node.fake.units["llmgw-engine-r2.service"].pid
    await replicas.apply([spec("r1")])
    assert [s.id for s in replicas.statuses()] == ["r1"]
    assert "llmgw-engine-r2.service" not in node.fake.units
    with pytest.raises(ProcessLookupError):
        os.kill(r2_pid, 0)
    assert not (node.tmp / "state" / "engines" / "r2.json").exists()
    assert not (node.tmp / "run" / "keys" / "r2.key").exists()
    assert "llmgw-engine-r1.service" in node.fake.units


async def test_a_changed_spec_starts_the_engine_again(node: Node) -> None:
    replicas = await node.new_replicas()
    await replicas.apply([spec()])
    port = (await until(replicas, ready()))["r1"].port
    await replicas.apply([spec()])  # the same spec: nothing to do
    assert len(node.fake.started) == 1
    await replicas.apply([spec(context=2048)])
    got = (await until(replicas, ready()))["r1"]
    assert len(node.fake.started) == 2 and got.port == port and got.restarts == 0


async def test_refused_args_are_reported_and_never_started(node: Node) -> None:
    replicas = await node.new_replicas()
    await replicas.apply([spec(args=["--api_key_file=/etc/shadow"])])
    (got,) = replicas.statuses()
    assert got.state == "failed" and "--api_key_file" in got.message
    assert node.fake.started == []


async def test_a_restarted_agent_adopts_the_running_engine(node: Node) -> None:
    first = await node.new_replicas()
    await first.apply([spec()])
    port = (await until(first, ready()))["r1"].port
    pid = node.fake.units["llmgw-engine-r1.service"].pid
    await first.close()
    os.kill(pid, 0)  # closing the agent left the engine serving
    assert await get(port, "/v1/models", KEY) == 200

    second = await node.new_replicas()
    got = (await until(second, ready()))["r1"]
    assert got.port == port
    await second.apply([spec()])
    assert node.fake.started == ["llmgw-engine-r1.service"]
    assert node.fake.units["llmgw-engine-r1.service"].pid == pid
    # Still supervised: a death after adoption is restarted.
    node.fake.kill("llmgw-engine-r1.service")
    await until(second, lambda s: ready()(s) and s["r1"].restarts == 1)


async def test_an_adopted_engine_that_answers_is_ready_in_the_first_report(node: Node) -> None:
    """The agent restarted (an upgrade restarts it): an engine that answers is ready as soon
    as start() returns, before any supervisor probe, so the first Register keeps it routed."""
    first = await node.new_replicas()
    await first.apply([spec()])
    before = (await until(first, ready()))["r1"]
    await first.close()
    second = Replicas(
        node.config, bus_address=node.address, runtime_dir=node.tmp / "run",
        on_change=node.on_change, command=engine_command, probe_interval=3600,
        inventory=lambda: node.inventory, online_cpus=lambda: node.cpus,
    )  # fmt: skip
    node.made.append(second)
    await second.start()  # its supervisor would first probe an hour from now
    (got,) = second.statuses()
    assert (got.state, got.port, got.slots, got.context) == (
        "ready",
        before.port,
        before.slots,
        before.context,
    )


async def test_adoption_stops_nothing_until_the_first_apply(node: Node) -> None:
    first = await node.new_replicas()
    await first.apply([spec()])
    await until(first, ready())
    await first.close()
    # An engine of ours the agent has no record of (say its state dir was lost).
    sd = Systemd(node.address)
    await sd.connect()
    stray = "llmgw-engine-stray.service"
    await sd.start_transient(stray, [sys.executable, "-c", "import time; time.sleep(60)"], [])
    await sd.close()

    second = await node.new_replicas()
    await until(second, ready())
    assert {"llmgw-engine-r1.service", stray} <= set(node.fake.units)
    await second.apply([])
    assert second.statuses() == []
    assert not node.fake.units


def test_a_new_priority_keeps_the_engine_and_new_cards_restart_it() -> None:
    s = spec()
    assert msgspec.structs.replace(s, priority=5).fingerprint() == s.fingerprint()
    assert msgspec.structs.replace(s, devices=["GPU-a"]).fingerprint() != s.fingerprint()


async def test_a_ready_engine_reports_its_slots_from_props(node: Node) -> None:
    replicas = await node.new_replicas()
    await replicas.apply([spec(args=["--parallel", "3"]), spec("r2")])
    got = await until(replicas, lambda s: ready("r1")(s) and ready("r2")(s))
    assert got["r1"].slots == 3  # /props wants the key: the agent sends the replica's
    assert got["r2"].slots == 4  # the engine's default


async def test_a_ready_engine_reports_its_context_from_props(node: Node) -> None:
    # The router bounds requests by it where the catalog gives the model no context.
    replicas = await node.new_replicas()
    await replicas.apply([spec(context=2048), spec("r2")])
    got = await until(replicas, lambda s: ready("r1")(s) and ready("r2")(s))
    assert got["r1"].context == 2048
    assert got["r2"].context == 8192  # the engine's default: the model's own


async def test_the_unit_has_the_specs_memory_limit_and_no_swap(node: Node) -> None:
    replicas = await node.new_replicas()
    await replicas.apply([spec(memory_max_bytes=3 << 30)])
    await until(replicas, ready())
    props = node.fake.units["llmgw-engine-r1.service"].properties
    assert props["MemoryMax"] == 3 << 30 and props["MemorySwapMax"] == 0


async def test_a_spec_without_a_limit_gets_the_nodes_default(node: Node) -> None:
    node.config = msgspec.structs.replace(node.config, engines=Engines(memory_max_bytes=5 << 30))
    replicas = await node.new_replicas()
    await replicas.apply([spec()])  # a model placed by count, or an older control plane
    await until(replicas, ready())
    assert node.fake.units["llmgw-engine-r1.service"].properties["MemoryMax"] == 5 << 30


def argv_host(node: Node, unit: str = "llmgw-engine-r1.service") -> str:
    ((_, argv, _),) = node.fake.units[unit].properties["ExecStart"]
    return str(argv[argv.index("--host") + 1])


async def test_engines_listen_where_the_control_plane_reaches_the_node(node: Node) -> None:
    node.config = msgspec.structs.replace(node.config, address="")  # learnt from the link
    replicas = await node.new_replicas()
    await replicas.apply([spec()])  # before the link said anything: loopback, never 0.0.0.0
    port = (await until(replicas, ready()))["r1"].port
    assert argv_host(node) == "127.0.0.1"
    replicas.set_host("127.0.0.2")  # the link's own end: the node's cluster address
    await replicas.apply([spec()])
    got = await until(replicas, lambda s: ready()(s) and len(node.fake.started) == 2)
    assert argv_host(node) == "127.0.0.2" and got["r1"].port == port  # moved, same port


async def test_a_configured_address_wins_over_the_links(node: Node) -> None:
    replicas = await node.new_replicas()
    replicas.set_host("10.9.9.9")
    await replicas.apply([spec()])
    await until(replicas, ready())
    assert argv_host(node) == "127.0.0.1"  # agent.yaml's address


async def test_an_adopted_record_without_a_limit_restarts_with_the_nodes_default(
    node: Node,
) -> None:
    # A record written before limits existed (or for a model placed by count) keeps 0:
    # MemoryMax=0 would have the kernel end the engine at once.
    node.config = msgspec.structs.replace(node.config, engines=Engines(memory_max_bytes=5 << 30))
    records = Path(node.config.state_dir) / "engines"
    records.mkdir(parents=True)
    old = msgspec.structs.replace(spec(), api_key="")
    with socket.socket() as s:  # a port free now (a fixed one may be a connection's own)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    record = EngineRecord(spec().fingerprint(), port, old, "127.0.0.1")
    (records / "r1.json").write_bytes(msgspec.json.encode(record))
    replicas = await node.new_replicas()
    await replicas.apply([spec()])  # the same spec: started from its record
    await until(replicas, ready())
    assert node.fake.units["llmgw-engine-r1.service"].properties["MemoryMax"] == 5 << 30
