"""The admin API /api/v1 served on a real Unix socket over the SQLite store, and its auth."""

from __future__ import annotations

import asyncio
import grp
import json
import os
import pwd
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.typedefs import Middleware

from llmgw import wire
from llmgw.localsock import allowed, secure_socket
from llmgwd.api.access import key_auth, peercred_auth
from llmgwd.api.base import API_PREFIX, ApiContext, ClusterNodes, NodeInfo
from llmgwd.api.routes import api_app, api_subapp
from llmgwd.catalog import Catalog
from llmgwd.nodes import state as cluster
from llmgwd.store.sqlite import SqliteStore

JOIN_URL = "https://cp.example:7710"


class FakeNodes:
    """The cluster state's nodes, set by the test."""

    def __init__(self) -> None:
        self.items: list[NodeInfo] = []

    def nodes(self) -> list[NodeInfo]:
        return list(self.items)


def node(name: str, *replicas: wire.ReplicaStatus, connected: bool = True) -> NodeInfo:
    return NodeInfo(
        name=name,
        address=f"10.0.0.{len(name)}",
        connected=connected,
        last_seen=1.0,
        cores=8,
        memory_bytes=32 << 30,
        replicas=list(replicas),
    )


class Tokens:
    """mint_token: predictable tokens the test can check."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> str:
        self.count += 1
        return f"llmgw-join-test-{self.count}"


@pytest.fixture
async def catalog() -> AsyncIterator[Catalog]:
    store = await SqliteStore.open(":memory:")
    cat = Catalog(store)
    await cat.load()
    yield cat
    await store.close()


@pytest.fixture
def nodes() -> FakeNodes:
    return FakeNodes()


@pytest.fixture
def ctx(catalog: Catalog, nodes: FakeNodes) -> ApiContext:
    return ApiContext(
        catalog=catalog, nodes=nodes, mint_token=Tokens(), join_url=JOIN_URL, token_ttl_s=600
    )


@asynccontextmanager
async def serve(app: web.Application, path: Path) -> AsyncIterator[aiohttp.ClientSession]:
    """Serve app on a Unix socket at path; yield a client session talking to it."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, str(path)).start()
    try:
        connector = aiohttp.UnixConnector(path=str(path))
        async with aiohttp.ClientSession("http://llmgwd", connector=connector) as session:
            yield session
    finally:
        await runner.cleanup()


@pytest.fixture
async def client(ctx: ApiContext, tmp_path: Path) -> AsyncIterator[aiohttp.ClientSession]:
    async with serve(api_app(ctx, peercred_auth("llmgw")), tmp_path / "d.sock") as session:
        yield session


async def call(
    session: aiohttp.ClientSession, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    async with session.request(method, "/api/v1" + path, json=body) as resp:
        return resp.status, await resp.json()


MODEL = {"name": "smol", "source": "file:/models/smol.gguf", "engine": "llama.cpp"}


async def test_model_add_serve_stop_list(client: aiohttp.ClientSession, nodes: FakeNodes) -> None:
    status, added = await call(client, "POST", "/models", {**MODEL, "args": ["--temp", "0.2"]})
    assert status == 201
    assert (added["name"], added["replicas"], added["args"]) == ("smol", 0, ["--temp", "0.2"])

    status, served = await call(client, "POST", "/models/smol/serve", {"replicas": 2})
    assert (status, served["replicas"]) == (200, 2)

    nodes.items = [
        node("n1", wire.ReplicaStatus(id="r1", model="smol", state="ready", slots=4)),
        node("n2", wire.ReplicaStatus(id="r2", model="smol", state="starting", message="loading")),
        node("n3", wire.ReplicaStatus(id="r3", model="other", state="ready")),
    ]
    status, models = await call(client, "GET", "/models")
    assert status == 200
    [m] = models
    assert (m["name"], m["source"], m["engine"], m["context"]) == (
        "smol",
        "file:/models/smol.gguf",
        "llama.cpp",
        0,
    )
    assert (m["replicas"], m["ready"]) == (2, 1)
    assert m["replica_status"] == [
        {"id": "r1", "node": "n1", "state": "ready", "message": "", "restarts": 0, "slots": 4,
         "reason": "", "oom_kills": 0},
        {"id": "r2", "node": "n2", "state": "starting", "message": "loading", "restarts": 0,
         "slots": 0, "reason": "", "oom_kills": 0},
    ]  # fmt: skip

    status, stopped = await call(client, "POST", "/models/smol/stop")
    assert (status, stopped["replicas"]) == (200, 0)
    status, removed = await call(client, "DELETE", "/models/smol")
    assert (status, removed) == (200, {"name": "smol", "removed": True})
    assert await call(client, "GET", "/models") == (200, [])


async def test_replicas_on_a_disconnected_node_are_not_ready(
    client: aiohttp.ClientSession, nodes: FakeNodes
) -> None:
    await call(client, "POST", "/models", MODEL)
    nodes.items = [node("n1", wire.ReplicaStatus("r1", "smol", "ready"), connected=False)]
    _, m = await call(client, "GET", "/models/smol")
    assert m["ready"] == 0
    assert m["replica_status"][0]["state"] == "unknown"


async def test_duplicate_model_is_a_conflict(client: aiohttp.ClientSession) -> None:
    assert (await call(client, "POST", "/models", MODEL))[0] == 201
    status, body = await call(client, "POST", "/models", MODEL)
    assert status == 409
    assert body["error"]["type"] == "conflict_error"
    assert "smol" in body["error"]["message"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Bad Name"}, "name"),
        ({"name": "-x"}, "name"),
        ({"source": "file:models/smol.gguf"}, "source"),
        ({"source": "hf:org/repo"}, "source"),
        ({"engine": "strata"}, "engine"),
        ({"engine": "vllm"}, "source"),  # vllm serves a safetensors set from the mirror
        ({"engine": "vllm", "source": "hf:o/r", "args": ["--trust-remote-code"]}, "args"),
        ({"context": -1}, "context"),
        ({"context": "big"}, "context"),
        ({"args": ["--port", "1"]}, "args"),
        ({"args": "-t 2"}, "args"),
        ({"args": ["--ctx_size", "99"]}, "args"),
        ({"args": ["--ctx-size=99"]}, "args"),
        ({"args": ["-c", "99"]}, "args"),
        ({"args": ["--host", "0.0.0.0"]}, "args"),
        ({"args": ["--lora", "/etc/shadow"]}, "args"),
        ({"args": ["--temp", "hot"]}, "args"),
        ({"colour": "blue"}, "colour"),
    ],
)
async def test_bad_model_is_400_naming_the_field(
    client: aiohttp.ClientSession, change: dict[str, Any], field: str
) -> None:
    status, body = await call(client, "POST", "/models", {**MODEL, **change})
    assert status == 400
    assert body["error"]["param"] == field
    assert body["error"]["message"].startswith(field + ":")


async def test_missing_field_and_bad_json_are_400(client: aiohttp.ClientSession) -> None:
    status, body = await call(client, "POST", "/models", {"name": "x", "engine": "llama.cpp"})
    assert (status, body["error"]["param"]) == (400, "source")
    async with client.post("/api/v1/models", data=b"{nope") as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("replicas", [-1, "two", 100_000])
async def test_bad_replica_count_is_400(client: aiohttp.ClientSession, replicas: object) -> None:
    await call(client, "POST", "/models", MODEL)
    status, body = await call(client, "POST", "/models/smol/serve", {"replicas": replicas})
    assert (status, body["error"]["param"]) == (400, "replicas")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/models/nope", None),
        ("POST", "/models/nope/serve", {"replicas": 1}),
        ("POST", "/models/nope/stop", None),
        ("DELETE", "/models/nope", None),
        ("DELETE", "/keys/nope", None),
    ],
)
async def test_unknown_model_or_key_is_404(
    client: aiohttp.ClientSession, method: str, path: str, body: Any
) -> None:
    status, answer = await call(client, method, path, body)
    assert status == 404
    assert answer["error"]["type"] == "not_found_error"
    assert "nope" in answer["error"]["message"]


async def test_unknown_route_is_a_json_404(client: aiohttp.ClientSession) -> None:
    status, answer = await call(client, "GET", "/nothing-here")
    assert status == 404
    assert answer["error"]["type"] == "not_found_error"


async def test_keys_create_list_revoke(client: aiohttp.ClientSession, catalog: Catalog) -> None:
    status, made = await call(client, "POST", "/keys", {"name": "alice"})
    assert status == 201
    assert made["role"] == "user"
    assert made["key"].startswith("sk-llmgw-")
    assert catalog.authenticate(made["key"]) is not None

    async with client.get("/api/v1/keys") as resp:
        text = await resp.text()
    [listed] = json.loads(text)
    assert set(listed) == {"id", "name", "prefix", "role", "created_at", "revoked", "limits"}
    assert made["key"] not in text
    assert catalog.keys()[0].hash not in text
    assert made["key"].startswith(listed["prefix"])

    assert (await call(client, "POST", "/keys", {"name": "alice"}))[0] == 409
    status, revoked = await call(client, "DELETE", "/keys/alice")
    assert (status, revoked["id"], revoked["revoked"]) == (200, made["id"], True)
    assert catalog.authenticate(made["key"]) is None
    assert (await call(client, "GET", "/keys"))[1][0]["revoked"] is True


async def test_admin_key_and_revoke_by_id(client: aiohttp.ClientSession) -> None:
    _, made = await call(client, "POST", "/keys", {"name": "ops", "role": "admin"})
    assert made["role"] == "admin"
    status, revoked = await call(client, "DELETE", f"/keys/{made['id']}")
    assert (status, revoked["revoked"]) == (200, True)
    status, body = await call(client, "POST", "/keys", {"name": "x", "role": "root"})
    assert (status, body["error"]["param"]) == (400, "role")


async def test_token_is_stored_and_works_once(
    client: aiohttp.ClientSession, catalog: Catalog
) -> None:
    status, tok = await call(client, "POST", "/tokens")
    assert status == 201
    assert tok["token"] == "llmgw-join-test-1"
    assert tok["expires_in"] == 600
    assert tok["command"] == f"llmgw node join {JOIN_URL} --token llmgw-join-test-1"
    assert await catalog.consume_token(tok["token"])
    assert not await catalog.consume_token(tok["token"])


async def test_nodes_and_status(client: aiohttp.ClientSession, nodes: FakeNodes) -> None:
    await call(client, "POST", "/models", MODEL)
    await call(client, "POST", "/models/smol/serve", {"replicas": 1})
    nodes.items = [
        node("b", wire.ReplicaStatus("r1", "smol", "ready")),
        node("a", connected=False),
    ]
    status, listed = await call(client, "GET", "/nodes")
    assert status == 200
    assert [n["name"] for n in listed] == ["a", "b"]
    assert listed[1]["replicas"][0]["id"] == "r1"
    assert listed[1]["memory_bytes"] == 32 << 30
    _, st = await call(client, "GET", "/status")
    assert st["nodes"] == {"total": 2, "connected": 1}
    assert st["models"] == {"total": 1, "served": 1}
    assert st["replicas"] == {"wanted": 1, "ready": 1}
    assert st["join_url"] == JOIN_URL


# Peer credentials.


def test_allowed_root_and_own_uid() -> None:
    assert allowed(0, 4242, "no-such-group-xyz")
    assert allowed(4242, 4242, "no-such-group-xyz", own_uid=4242)
    assert not allowed(4242, 4242, "no-such-group-xyz", own_uid=1)


def test_allowed_by_effective_group() -> None:
    root_gid = grp.getgrnam("root").gr_gid
    assert allowed(4_000_001, root_gid, "root", own_uid=1)
    assert not allowed(4_000_001, 4_000_001, "root", own_uid=1)


def test_allowed_by_primary_or_supplementary_group(monkeypatch: pytest.MonkeyPatch) -> None:
    members = grp.struct_group(("llmgw", "x", 5000, ["bob"]))
    users = {
        1001: pwd.struct_passwd(("alice", "x", 1001, 5000, "", "/", "/bin/sh")),
        1002: pwd.struct_passwd(("bob", "x", 1002, 1002, "", "/", "/bin/sh")),
        1003: pwd.struct_passwd(("eve", "x", 1003, 1003, "", "/", "/bin/sh")),
    }

    def getgrnam(name: str) -> grp.struct_group:
        if name != "llmgw":
            raise KeyError(name)
        return members

    monkeypatch.setattr(grp, "getgrnam", getgrnam)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: users[uid])
    assert allowed(1001, 1001, "llmgw", own_uid=1)  # primary group
    assert allowed(1002, 1002, "llmgw", own_uid=1)  # supplementary
    assert not allowed(1003, 1003, "llmgw", own_uid=1)
    assert not allowed(1004, 1004, "llmgw", own_uid=1)  # no such user


async def test_peercred_lets_root_in_on_the_socket(client: aiohttp.ClientSession) -> None:
    assert os.getuid() == 0 or pytest.skip("the socket's caller is root only when run as root")
    status, _ = await call(client, "GET", "/status")
    assert status == 200


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another group needs root")
async def test_secure_socket(ctx: ApiContext, tmp_path: Path) -> None:
    sock = tmp_path / "s.sock"
    async with serve(api_app(ctx, peercred_auth("nogroup")), sock):
        secure_socket(str(sock), grp.getgrgid(65534).gr_name)
        assert (sock.stat().st_mode & 0o777, sock.stat().st_gid) == (0o660, 65534)


async def test_peercred_refuses_tcp(ctx: ApiContext) -> None:
    server = TestServer(api_app(ctx, peercred_auth("llmgw")))
    async with server, aiohttp.ClientSession() as session:
        resp = await session.get(server.make_url("/api/v1/status"))
        assert resp.status == 403
        assert (await resp.json())["error"]["code"] == "not_local"


CHILD = """
import sys
from llmgw import ipc
status, body = ipc.request(sys.argv[1], "GET", "/api/v1/status")
print(status, body.get("error", {}).get("code", "-"))
"""


async def _as_nobody(sock: Path) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        str(sock),
        user=65534,
        group=65534,
        extra_groups=[],
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    return out.decode().strip()


@pytest.mark.skipif(os.getuid() != 0, reason="switching to another user needs root")
async def test_peercred_with_a_real_other_user(ctx: ApiContext) -> None:
    nobody_group = grp.getgrgid(65534).gr_name
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        os.chmod(d, 0o755)  # nobody must reach the socket
        for group, expect in (("root", "403 not_allowed"), (nobody_group, "200 -")):
            sock = Path(d) / f"{group}.sock"
            async with serve(api_app(ctx, peercred_auth(group)), sock):
                sock.chmod(0o777)
                assert await _as_nobody(sock) == expect


# Admin keys on the client port.


@pytest.fixture
async def keyed(
    ctx: ApiContext, catalog: Catalog, tmp_path: Path
) -> AsyncIterator[aiohttp.ClientSession]:
    auth: Middleware = key_auth(catalog)
    async with serve(api_app(ctx, auth), tmp_path / "k.sock") as session:
        yield session


async def _status_with(session: aiohttp.ClientSession, header: str | None) -> tuple[int, str]:
    headers = {"Authorization": header} if header else {}
    async with session.get("/api/v1/status", headers=headers) as resp:
        text = await resp.text()
        if resp.status == 401:
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        return resp.status, text


async def test_key_auth(keyed: aiohttp.ClientSession, catalog: Catalog) -> None:
    _, user = await catalog.create_key("alice")
    admin_key, admin = await catalog.create_key("ops", "admin")
    assert (await _status_with(keyed, None))[0] == 401
    assert (await _status_with(keyed, "Basic abc"))[0] == 401
    status, text = await _status_with(keyed, "Bearer sk-llmgw-wrong")
    assert status == 401
    assert "sk-llmgw-wrong" not in text
    status, text = await _status_with(keyed, f"Bearer {user}")
    assert status == 403
    assert '"not_allowed"' in text
    assert user not in text
    assert (await _status_with(keyed, f"Bearer {admin}"))[0] == 200
    await catalog.revoke_key(admin_key.id)
    assert (await _status_with(keyed, f"Bearer {admin}"))[0] == 401


async def test_subapp_mounts_under_a_parent(ctx: ApiContext, tmp_path: Path) -> None:
    parent = web.Application()
    parent.add_subapp(API_PREFIX, api_subapp(ctx, peercred_auth("llmgw")))
    async with serve(parent, tmp_path / "p.sock") as session:
        assert (await call(session, "GET", "/models")) == (200, [])


def test_cluster_nodes_adapts_the_cluster_state() -> None:
    inv = wire.Inventory(
        cores=4, memory_bytes=8 << 30, memory_free_bytes=1 << 30, firewall="nftables: broken"
    )
    rec = cluster.NodeInfo(
        name="n1",
        address="10.0.0.1",
        version="0.1.0",
        inventory=inv,
        replicas=(wire.ReplicaStatus("r1", "smol", "ready"),),
        desired=None,
        connected=True,
        last_seen=5.0,
    )
    [n] = ClusterNodes(lambda: [rec]).nodes()
    assert (n.name, n.cores, n.memory_bytes, n.version, n.last_seen) == (
        "n1",
        4,
        8 << 30,
        "0.1.0",
        5.0,
    )
    assert n.replicas == [wire.ReplicaStatus("r1", "smol", "ready")]
    assert n.firewall == "nftables: broken"  # the node's table as its agent reports it


async def test_get_nodes_carries_each_node_s_disks_as_its_agent_reported_them(
    client: aiohttp.ClientSession, nodes: FakeNodes
) -> None:
    disks = [
        wire.Disk("/var/lib/llmgw-agent", 900 << 30, 12 << 30),
        wire.Disk("/", 50 << 30, 9 << 30),
    ]
    inv = wire.Inventory(cores=4, memory_bytes=8 << 30, memory_free_bytes=1 << 30, disks=disks)
    rec = cluster.NodeInfo(
        name="n1", address="10.0.0.1", version="0.1.0", inventory=inv, replicas=(),
        desired=None, connected=True, last_seen=5.0,
    )  # fmt: skip
    nodes.items = ClusterNodes(lambda: [rec]).nodes()
    status, listed = await call(client, "GET", "/nodes")
    assert status == 200
    assert listed[0]["disks"] == [
        {"path": "/var/lib/llmgw-agent", "total_bytes": 900 << 30, "free_bytes": 12 << 30},
        {"path": "/", "total_bytes": 50 << 30, "free_bytes": 9 << 30},
    ]


async def test_a_refused_engine_argument_is_named_with_why(client: aiohttp.ClientSession) -> None:
    status, body = await call(client, "POST", "/models", {**MODEL, "args": ["--ctx_size", "99"]})
    assert (status, body["error"]["code"], body["error"]["param"]) == (400, "invalid_field", "args")
    assert body["error"]["message"] == (
        "args: argument --ctx_size (--ctx-size) is not allowed: the scheduler sets the context"
        " (llmgw model context, or a profile's)"
    )
