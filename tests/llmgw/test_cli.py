"""The llmgw CLI against a real admin API (and a stand-in agent) on Unix sockets, and the
same tests over HTTPS: the API guarded by keys, reached through a context with an admin key
and its CA pinned."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from llmgw import config, wire
from llmgw.cli import plane
from llmgw.cli.main import main
from llmgwd.accounting.usage import Usage
from llmgwd.api.access import key_auth, peercred_auth
from llmgwd.api.base import ApiContext, NodeInfo
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog
from llmgwd.providers.credentials import Credentials
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw.https_site import ADMIN_SECRET, WithAdmin, add_context, make_tls, start_tls_site

T = TypeVar("T")
JOIN_URL = "https://cp.example:7710"
CA_PIN = "c0" * 32  # the cluster CA's sha256, as /status gives it
CLUSTER_SECRET = b"the-cluster-secret-of-the-tests"  # providers' credentials are sealed by it


class FakeNodes:
    """The cluster state's nodes, set by the test."""

    def __init__(self) -> None:
        self.items: list[NodeInfo] = []

    def nodes(self) -> list[NodeInfo]:
        return list(self.items)


@dataclass
class Daemon:
    """llmgwd's API and a stand-in agent, served from a loop on a background thread."""

    socket: str
    agent_socket: str
    catalog: Catalog
    nodes: FakeNodes
    loop: asyncio.AbstractEventLoop
    joins: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage | None = None  # what `llmgw usage` reads
    env: dict[str, str] = field(default_factory=dict)  # XDG_CONFIG_HOME, LLMGW_CONTEXT
    url: str = ""  # over HTTPS: the API's

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def cli(self, *args: str) -> Result:
        base = ["--socket", self.socket, "--agent-socket", self.agent_socket]
        return CliRunner().invoke(main, [*base, *args], env=self.env)


def agent_app(joins: list[dict[str, Any]]) -> web.Application:
    """llmgw-agentd's join route, recording what it was asked."""

    async def join(request: web.Request) -> web.Response:
        joins.append(await request.json())
        return web.json_response({"node": "n1", "url": joins[-1]["url"]})

    app = web.Application()
    app.router.add_post("/api/v1/join", join)
    return app


async def _start_site(app: web.Application, path: str) -> web.AppRunner:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, path).start()
    return runner


@pytest.fixture(params=["socket", "https"])
def daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    """The API over the Unix socket, or over HTTPS with the commands' context (an admin key
    in a key file, the CA pinned by its fingerprint)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    nodes = FakeNodes()

    async def open_catalog() -> tuple[SqliteStore, Catalog]:
        store = await SqliteStore.open(":memory:")
        catalog = Catalog(store)
        await catalog.load()
        return store, catalog

    store, catalog = asyncio.run_coroutine_threadsafe(open_catalog(), loop).result(10)
    usage = Usage(store)
    sockets = str(tmp_path / "d.sock"), str(tmp_path / "a.sock")
    d = Daemon(*sockets, catalog, nodes, loop, usage=usage)
    ctx = ApiContext(
        catalog=catalog, nodes=nodes, mint_token=lambda: "tok-1", join_url=JOIN_URL, usage=usage,
        ca_fingerprint=CA_PIN, credentials=Credentials(CLUSTER_SECRET),
    )  # fmt: skip
    d.env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    runners = [d.run(_start_site(agent_app(d.joins), d.agent_socket))]
    if request.param == "socket":
        runners.append(d.run(_start_site(api_app(ctx, peercred_auth("llmgw")), d.socket)))
    else:
        tls = make_tls(tmp_path)
        app = api_app(ctx, key_auth(WithAdmin(catalog)))
        runner, d.url = d.run(start_tls_site(app, tls.server))
        runners.append(runner)
        (tmp_path / "admin.key").write_text(ADMIN_SECRET + "\n")
        add_context(tmp_path / "config", "test", d.url, "--ca-fingerprint", tls.fingerprint,
                    "--key-file", str(tmp_path / "admin.key"))  # fmt: skip
        d.env["LLMGW_CONTEXT"] = "test"
    yield d
    for runner in runners:
        d.run(runner.cleanup())
    d.run(store.close())
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def rows(output: str) -> list[list[str]]:
    """A table's lines, split on runs of two or more spaces."""
    return [re.split(r"\s{2,}", line.strip()) for line in output.strip().splitlines()]


def test_model_commands(daemon: Daemon) -> None:
    r = daemon.cli(
        "model", "add", "smol", "--from", "file:/m/smol.gguf", "--arg", "--temp", "--arg", "0.2"
    )
    assert r.exit_code == 0, r.output
    assert "llmgw model serve smol --replicas 1" in r.stdout
    assert rows(daemon.cli("models").stdout) == [
        ["NAME", "ENGINE", "READY", "CONTEXT", "STATUS", "REPLICAS", "SOURCE"],
        ["smol", "llama.cpp", "0/0", "default", "stopped", "default 0", "file:/m/smol.gguf"],
    ]

    r = daemon.cli("model", "serve", "smol", "--replicas", "2")
    assert (r.exit_code, r.stdout.strip()) == (0, "model smol: 2 replicas wanted, 0 ready")
    daemon.nodes.items = [
        NodeInfo(
            name="n1",
            address="10.0.0.1",
            connected=True,
            last_seen=1.0,
            cores=4,
            memory_bytes=8 << 30,
            replicas=[wire.ReplicaStatus("r1", "smol", "ready", slots=4)],
        )
    ]
    assert rows(daemon.cli("models").stdout)[1][2:5] == ["1/2", "default", "starting"]
    [m] = json.loads(daemon.cli("models", "--json").stdout)
    assert (m["name"], m["args"], m["ready"]) == ("smol", ["--temp", "0.2"], 1)
    assert m["replica_status"] == [
        {
            "id": "r1",
            "node": "n1",
            "state": "ready",
            "message": "",
            "restarts": 0,
            "slots": 4,
            "reason": "",
            "oom_kills": 0,
        }
    ]

    assert daemon.cli("model", "stop", "smol").exit_code == 0
    stopped = daemon.catalog.get("smol")
    assert stopped is not None
    assert stopped.replicas == 0
    r = daemon.cli("model", "remove", "smol")
    assert (r.exit_code, r.stdout.strip()) == (0, "Removed model smol.")
    assert "No models yet" in daemon.cli("models").stdout
    assert json.loads(daemon.cli("models", "--json").stdout) == []


def test_model_max_tokens_and_restart(daemon: Daemon) -> None:
    assert daemon.cli("model", "add", "smol", "--from", "file:/m.gguf").exit_code == 0
    r = daemon.cli("model", "max-tokens", "smol", "300")
    assert (r.exit_code, r.stdout.strip()) == (0, "Model smol: longest answer 300 tokens.")
    r = daemon.cli("model", "restart", "smol")
    restarting = "Restarting model smol: 0 replicas wanted, 0 ready."
    assert (r.exit_code, r.stdout.strip()) == (0, restarting)
    model = daemon.catalog.get("smol")
    assert model is not None and (model.max_tokens, model.generation) == (300, 1)
    assert daemon.cli("model", "restart", "nope").exit_code == 4


def test_model_replicas_sets_a_gpu_profile_s_cards(daemon: Daemon) -> None:
    assert daemon.cli("model", "add", "smol", "--from", "file:/m.gguf").exit_code == 0
    r = daemon.cli("model", "replicas", "smol", "2", "--profile", "gpu", "--gpus", "4")
    assert r.exit_code == 0, r.stderr
    model = daemon.catalog.get("smol")
    assert model is not None
    assert [(p.name, p.kind, p.replicas, p.gpus) for p in model.profiles if p.name == "gpu"] == [
        ("gpu", "gpu", 2, 4)
    ]
    r = daemon.cli("model", "replicas", "smol", "1", "--profile", "gpu", "--gpus", "0")
    assert r.exit_code == 2  # refused before anything is sent


def test_refusals_exit_1_with_the_reason(daemon: Daemon) -> None:
    r = daemon.cli("model", "add", "smol", "--from", "models/smol.gguf")
    assert r.exit_code == 1
    assert "source: must be hf:ORG/REPO[@REV][:PATTERN] or file:/absolute/path" in r.stderr
    assert daemon.cli("model", "add", "smol", "--from", "file:/m.gguf").exit_code == 0
    r = daemon.cli("model", "add", "smol", "--from", "file:/m.gguf")
    assert r.exit_code == 1
    assert "already exists" in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["model", "serve", "nope", "--replicas", "1"],
        ["model", "stop", "nope"],
        ["model", "remove", "nope"],
        ["key", "revoke", "nope"],
    ],
)
def test_unknown_name_exits_4(daemon: Daemon, args: list[str]) -> None:
    r = daemon.cli(*args)
    assert r.exit_code == 4
    assert "'nope'" in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["model", "serve", "smol"],
        ["model", "serve", "smol", "--replicas", "-1"],
        ["model", "add", "smol", "--from", "file:/m.gguf", "--engine", "tensorrt-llm"],
        ["node", "join", "http://cp:7710", "--token", "t"],
        ["nodes", "--bogus"],
    ],
)
def test_usage_errors_exit_2(daemon: Daemon, args: list[str]) -> None:
    assert daemon.cli(*args).exit_code == 2


def test_unreachable_daemon_exits_3(tmp_path: Path) -> None:
    gone = str(tmp_path / "gone.sock")
    r = CliRunner().invoke(main, ["--socket", gone, "models"])
    assert r.exit_code == 3
    assert f"llmgwd is not running: no {gone}" in r.stderr
    r = CliRunner().invoke(main, ["nodes"], env={"LLMGW_SOCKET": gone})
    assert r.exit_code == 3
    r = CliRunner().invoke(main, ["--agent-socket", gone, "node", "join", JOIN_URL, "--token", "t"])
    assert r.exit_code == 3
    assert "llmgw-agentd is not running" in r.stderr


def test_key_commands(daemon: Daemon) -> None:
    r = daemon.cli("key", "create", "alice")
    assert r.exit_code == 0
    secret = r.stdout.strip()
    assert secret.startswith("sk-llmgw-")
    assert "not shown again" in r.stderr
    assert daemon.catalog.authenticate(secret) is not None

    listing = daemon.cli("key", "list")
    assert secret not in listing.output
    header, row = rows(listing.stdout)
    assert header == ["ID", "NAME", "ROLE", "PREFIX", "CREATED", "STATE", "LIMITS"]
    assert row[1:3] == ["alice", "user"]
    assert secret.startswith(row[3].removesuffix("..."))
    assert row[5:] == ["active", "none"]
    as_json = daemon.cli("key", "list", "--json").stdout
    assert secret not in as_json
    assert "key" not in json.loads(as_json)[0]

    admin = json.loads(daemon.cli("key", "create", "ops", "--admin", "--json").stdout)
    assert admin["role"] == "admin"
    assert admin["key"].startswith("sk-llmgw-")

    r = daemon.cli("key", "revoke", row[0])
    assert (r.exit_code, r.stdout.strip()) == (0, f"Revoked key {row[0]} (alice).")
    assert daemon.catalog.authenticate(secret) is None
    assert rows(daemon.cli("key", "list").stdout)[1][5] == "revoked"


def test_node_token_and_nodes(daemon: Daemon) -> None:
    r = daemon.cli("node", "token")
    assert r.exit_code == 0
    assert f"llmgw node join {JOIN_URL} --token tok-1" in r.stdout
    assert json.loads(daemon.cli("node", "token", "--json").stdout)["token"] == "tok-1"
    assert daemon.run(daemon.catalog.consume_token("tok-1"))

    assert "No nodes yet" in daemon.cli("nodes").stdout
    daemon.nodes.items = [
        NodeInfo(
            name="gpu1",
            address="10.0.0.7",
            connected=False,
            last_seen=0.0,
            cores=16,
            memory_bytes=64 << 30,
            replicas=[wire.ReplicaStatus("r1", "smol", "failed", message="oom")],
        )
    ]
    head = ["NAME", "ADDRESS", "STATE", "LAST SEEN", "CORES", "MEMORY", "GPUS", "ENGINES"]
    assert rows(daemon.cli("nodes").stdout) == [
        [*head, "REPLICAS"],
        [
            "gpu1",
            "10.0.0.7",
            "disconnected",
            "never",
            "16",
            "64.0 GiB",
            "0",
            "llama.cpp:cpu",
            "0/1",
        ],
    ]
    [n] = json.loads(daemon.cli("nodes", "--json").stdout)
    assert (n["name"], n["replicas"][0]["message"]) == ("gpu1", "oom")


def test_nodes_say_the_engines_and_a_node_with_cards_but_no_cuda_toolkit(daemon: Daemon) -> None:
    def card_node(
        name: str, engines: list[str], toolkit: str = "", note: str = "", firewall: str = "ok"
    ) -> NodeInfo:
        return NodeInfo(
            name=name,
            address="10.0.0.1",
            connected=True,
            last_seen=0.0,
            cores=8,
            memory_bytes=64 << 30,
            gpus=8,
            cuda_toolkit=toolkit,
            engines=engines,
            note=note,
            firewall=firewall,
        )

    daemon.nodes.items = [
        card_node("a", ["llama.cpp:cpu", "llama.cpp:gpu", "vllm:gpu"], toolkit="12.4"),
        card_node(
            "b",
            ["llama.cpp:cpu", "vllm:gpu"],
            note="no CUDA toolkit: llama.cpp runs on CPUs only here",
            firewall="nftables: no libnftables.so.1 on this node",
        ),
    ]
    out = daemon.cli("nodes").stdout
    table = rows(out)
    assert [r[6:8] for r in table[1:3]] == [
        ["8", "llama.cpp:cpu,gpu vllm:gpu (CUDA 12.4)"],
        ["8", "llama.cpp:cpu vllm:gpu"],
    ]
    assert out.splitlines()[-2:] == [
        "b: no CUDA toolkit: llama.cpp runs on CPUs only here",
        "b: its firewall is not set: nftables: no libnftables.so.1 on this node",
    ]


def test_node_join_asks_the_agent(daemon: Daemon) -> None:
    r = daemon.cli("node", "join", JOIN_URL, "--token", "tok-9")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == f"Joined the cluster at {JOIN_URL} as node n1."
    assert daemon.joins == [{"url": JOIN_URL, "token": "tok-9"}]


def test_status(daemon: Daemon) -> None:
    r = daemon.cli("status")
    assert r.exit_code == 0
    assert f"join URL: {JOIN_URL}" in r.stdout
    assert f"CA sha256: {CA_PIN}" in r.stdout  # what a context elsewhere pins
    assert json.loads(daemon.cli("status", "--json").stdout)["nodes"]["total"] == 0


def test_plane_init_writes_the_config(tmp_path: Path) -> None:
    cfg_path = tmp_path / "etc" / "server.yaml"
    args = ["plane", "init", "--config", str(cfg_path), "--state-dir", str(tmp_path / "state")]
    r = CliRunner().invoke(main, [*args, "--no-start"])
    assert r.exit_code == 0, r.output
    cfg = config.load(cfg_path, config.ServerConfig)
    assert cfg.cluster.advertise.startswith("https://")
    assert cfg.cluster.advertise.endswith(":7710")
    assert cfg.state_dir == str(tmp_path / "state")
    assert (tmp_path / "state").is_dir()
    # it may hold a proxy's password: as restore writes it, not world-readable
    assert cfg_path.stat().st_mode & 0o777 == 0o640
    assert cfg_path.parent.stat().st_mode & 0o777 == 0o750

    r = CliRunner().invoke(main, [*args, "--no-start"])
    assert r.exit_code == 1
    assert "--force" in r.stderr
    r = CliRunner().invoke(main, [*args, "--no-start", "--force", "--advertise", "https://cp:7710"])
    assert r.exit_code == 0
    assert config.load(cfg_path, config.ServerConfig).cluster.advertise == "https://cp:7710"
    r = CliRunner().invoke(main, [*args, "--force", "--advertise", "cp:7710"])
    assert r.exit_code == 2


@pytest.mark.parametrize("daemon", ["socket"], indirect=True)  # this host's llmgwd, any context
def test_plane_init_starts_llmgwd_and_prints_the_join_command(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[bool] = []
    monkeypatch.setattr(plane, "systemd_running", lambda: True)
    monkeypatch.setattr(plane, "start_llmgwd", lambda: started.append(True))
    cfg_path = tmp_path / "server.yaml"
    r = daemon.cli("plane", "init", "--config", str(cfg_path), "--state-dir", str(tmp_path / "s"))
    assert r.exit_code == 0, r.output
    assert started == [True]
    assert "Waiting for llmgwd" in r.stderr
    assert f"llmgw node join {JOIN_URL} --token tok-1" in r.stdout
    assert f":7700 --ca-fingerprint {CA_PIN}" in r.stdout  # llmgw context add, elsewhere
    assert config.load(cfg_path, config.ServerConfig).socket == daemon.socket


def test_plane_init_without_systemd_says_how_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plane, "systemd_running", lambda: False)
    args = ["--config", str(tmp_path / "server.yaml"), "--state-dir", str(tmp_path / "s")]
    r = CliRunner().invoke(main, ["plane", "init", *args, "--json"])
    assert r.exit_code == 0
    assert "start llmgwd yourself" in r.stderr
    assert json.loads(r.stdout)["started"] is False


def test_plane_init_gives_up_when_llmgwd_does_not_come_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plane, "systemd_running", lambda: True)
    monkeypatch.setattr(plane, "start_llmgwd", lambda: None)
    args = ["--config", str(tmp_path / "server.yaml"), "--state-dir", str(tmp_path / "s")]
    sock = str(tmp_path / "never.sock")
    r = CliRunner().invoke(main, ["--socket", sock, "plane", "init", *args, "--wait", "0.3"])
    assert r.exit_code == 3
    assert "journalctl -u llmgwd" in r.stderr


def test_every_command_has_help() -> None:
    for args in (
        [],
        ["plane", "init"],
        ["node", "token"],
        ["node", "join"],
        ["nodes"],
        ["model", "add"],
        ["model", "serve"],
        ["model", "stop"],
        ["model", "remove"],
        ["models"],
        ["key", "create"],
        ["key", "list"],
        ["key", "revoke"],
        ["status"],
    ):
        r = CliRunner().invoke(main, [*args, "--help"])
        assert r.exit_code == 0
        assert "Usage: " in r.stdout


def test_an_engine_killed_over_its_memory_is_said_so() -> None:
    import msgspec

    from llmgw.api_types import ModelView, ReplicaView
    from llmgw.cli.model import status_of

    failed = ReplicaView(
        id="r1", node="n1", state="failed", message="killed over its memory limit",
        reason="oom", oom_kills=2,
    )  # fmt: skip
    m = ModelView(
        name="m", source="file:/m.gguf", engine="llama.cpp", args=[], context=0, max_tokens=0,
        price_prompt=0, price_completion=0, replicas=1, ready=0, created_at=0,
        replica_status=[failed],
    )  # fmt: skip
    assert status_of(m) == "out of memory: killed over its memory limit (2 OOM kills)"
    ready = msgspec.structs.replace(failed, state="ready", reason="")
    m = msgspec.structs.replace(m, ready=1, replica_status=[ready])
    assert status_of(m) == "ready (2 OOM kills)"
