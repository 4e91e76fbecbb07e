"""`llmgw version` and `llmgw planes`' VERSION: this CLI's release, the llmgwd's it talks to
and every control plane's and node's, over the socket and over HTTPS."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from llmgw import package_version, pki, wire
from llmgwd.api.access import key_auth, peercred_auth
from llmgwd.api.base import ApiContext, NodeInfo
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog
from llmgwd.planes.listing import ControlPlanes
from llmgwd.planes.registry import SERVERS
from llmgwd.planes.tokens import PlaneTokens
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw.https_site import ADMIN_SECRET, WithAdmin, add_context, make_tls, start_tls_site
from tests.llmgw.test_cli import JOIN_URL, Daemon, FakeNodes, _start_site, rows


def node(name: str, version: str) -> NodeInfo:
    return NodeInfo(name=name, address="10.0.0.1", connected=True, last_seen=0.0, cores=4,
                    memory_bytes=8 << 30, version=version)  # fmt: skip


async def open_store() -> tuple[SqliteStore, Catalog]:
    store = await SqliteStore.open(":memory:")
    for name, version in (("cp1", "0.2.0"), ("cp2", "0.1.0")):
        info = wire.PlaneInfo(name, f"https://{name}:7710", version=version)
        await store.put(SERVERS + name, msgspec.json.encode(info))
    catalog = Catalog(store)
    await catalog.load()
    return store, catalog


@pytest.fixture(params=["socket", "https"])
def daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    store, catalog = asyncio.run_coroutine_threadsafe(open_store(), loop).result(10)
    d = Daemon(str(tmp_path / "d.sock"), str(tmp_path / "a.sock"), catalog, FakeNodes(), loop)
    planes = ControlPlanes(store, None, PlaneTokens(store, pki.make_ca().cert_pem), "cp1", JOIN_URL)
    ctx = ApiContext(catalog=catalog, nodes=d.nodes, mint_token=lambda: "t", join_url=JOIN_URL,
                     version="0.2.0", control_planes=planes)  # fmt: skip
    d.env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    if request.param == "socket":
        runner = d.run(_start_site(api_app(ctx, peercred_auth("llmgw")), d.socket))
    else:
        tls = make_tls(tmp_path)
        runner, d.url = d.run(
            start_tls_site(api_app(ctx, key_auth(WithAdmin(catalog))), tls.server)
        )
        (tmp_path / "admin.key").write_text(ADMIN_SECRET + "\n")
        add_context(tmp_path / "config", "test", d.url, "--ca-fingerprint", tls.fingerprint,
                    "--key-file", str(tmp_path / "admin.key"))  # fmt: skip
        d.env["LLMGW_CONTEXT"] = "test"
    yield d
    d.run(runner.cleanup())
    d.run(store.close())
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_version_says_each_release_and_which_hosts_lag(daemon: Daemon) -> None:
    daemon.nodes.items = [node("n1", "0.2.0"), node("n2", "0.2.0"), node("n3", "0.1.0")]
    r = daemon.cli("version")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == f"llmgw (this command): {package_version()}"
    assert lines[1].split(":", 1)[1].strip() == "0.2.0"
    assert lines[2] == "control planes:       0.2.0 (1: cp1), 0.1.0 (1: cp2)"
    assert lines[3] == "node agents:          0.2.0 (2: n1, n2), 0.1.0 (1: n3)"
    daemon.nodes.items = [node("n1", "0.2.0"), node("n2", "0.2.0")]
    assert daemon.cli("version").stdout.splitlines()[3].endswith("0.2.0 (2)")
    got = json.loads(daemon.cli("version", "--json").stdout)
    assert (got["cli"], got["llmgwd"]) == (package_version(), "0.2.0")
    assert got["planes"] == [
        {"name": "cp1", "version": "0.2.0"},
        {"name": "cp2", "version": "0.1.0"},
    ]


def test_planes_show_each_llmgwds_release(daemon: Daemon) -> None:
    got = rows(daemon.cli("planes").stdout)
    assert got[0] == ["NAME", "ADDRESS", "MEMBER", "HEALTH", "ROLE", "VERSION"]
    assert [(r[0], r[-1]) for r in got[1:]] == [("cp1 (this one)", "0.2.0"), ("cp2", "0.1.0")]
