"""The mirror's files for nodes on the cluster port (mutual TLS), and what nodes say they hold."""

from __future__ import annotations

import asyncio
import hashlib
import json
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from llmgw import pki, wire
from llmgw_agentd.link import Link, link_ssl_context
from llmgwd.mirror.holdings import Holdings
from llmgwd.nodes.members import Members
from llmgwd.nodes.port import bound_port, make_app, serve, server_ssl_context
from llmgwd.nodes.state import ClusterState, remove_node
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.test_cluster import INVENTORY, Cluster, eventually, node_dir
from tests.llmgwd.test_cluster import running as running  # a fixture

DATA = bytes(range(256)) * 4096  # 1 MiB
SHA = hashlib.sha256(DATA).hexdigest()


class Mirror:
    """The mirror's published files, as the mirror service gives them to node_files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()

    def blob(self, sha256: str) -> Path | None:
        path = self.root / sha256
        return path if path.is_file() else None

    def put(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        (self.root / sha).write_bytes(data)
        return sha


class MirrorCluster(Cluster):
    """A cluster port that serves the mirror's files."""

    mirror: Mirror

    async def start(self, state: ClusterState, port: int = 0) -> None:
        self.state = state
        app = make_app(state, self.ca, self.consume, self.members, files=self.mirror)
        ctx = server_ssl_context(self.ca.cert_pem, self.dir / "s.pem", self.dir / "s.key")
        self.runner = await serve(app, "127.0.0.1", port, ctx)
        self.port = bound_port(self.runner)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[MirrorCluster]:
    ca = pki.make_ca("test")
    pki.write_pair(pki.make_server_cert(ca), tmp_path / "s.pem", tmp_path / "s.key")
    store = await SqliteStore.open(":memory:")
    c = MirrorCluster(ca, tmp_path, Members(store))
    c.mirror = Mirror(tmp_path / "mirror")
    c.mirror.put(DATA)
    await c.start(ClusterState(grace_s=30, clock=c.clock))
    yield c
    await c.runner.cleanup()
    await store.close()


async def fetch(
    c: Cluster, ctx: ssl.SSLContext, sha: str = SHA, method: str = "GET", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, f"{c.url}/mirror/files/{sha}", ssl=ctx, headers=headers) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.read()


async def test_a_node_gets_a_file_whole_or_a_range(cluster: MirrorCluster, tmp_path: Path) -> None:
    ctx = link_ssl_context(node_dir(tmp_path, cluster.ca, "n1"))
    status, _, body = await fetch(cluster, ctx)
    assert status == 200 and body == DATA
    status, headers, body = await fetch(cluster, ctx, Range="bytes=1000-")
    assert status == 206 and body == DATA[1000:]
    assert headers["Content-Range"] == f"bytes 1000-{len(DATA) - 1}/{len(DATA)}"
    status, headers, body = await fetch(cluster, ctx, method="HEAD")
    assert status == 200 and body == b"" and headers["Content-Length"] == str(len(DATA))


async def test_a_file_the_mirror_lacks_is_a_404_in_the_cluster_ports_shape(
    cluster: MirrorCluster, tmp_path: Path
) -> None:
    ctx = link_ssl_context(node_dir(tmp_path, cluster.ca, "n1"))
    status, _, body = await fetch(cluster, ctx, sha="0" * 64)
    assert status == 404
    assert json.loads(body) == {
        "error": f"the mirror does not have file {'0' * 64}",
        "code": "not_in_mirror",
    }
    status, _, _ = await fetch(cluster, ctx, sha="../../etc/passwd")
    assert status == 404


async def test_no_file_without_a_valid_node_certificate(
    cluster: MirrorCluster, tmp_path: Path
) -> None:
    status, _, body = await fetch(cluster, pki.client_context(cluster.ca.cert_pem))
    assert status == 401 and DATA[:100] not in body
    other = pki.make_ca("other")
    with pytest.raises(aiohttp.ClientError):
        await fetch(cluster, link_ssl_context(node_dir(tmp_path, other, "n1")))


async def test_a_removed_nodes_certificate_gets_no_file(
    cluster: MirrorCluster, tmp_path: Path
) -> None:
    d = node_dir(tmp_path, cluster.ca, "n1")
    assert (await fetch(cluster, link_ssl_context(d)))[0] == 200
    await remove_node(cluster.state, cluster.members, "n1")
    status, _, body = await fetch(cluster, link_ssl_context(d))
    assert status == 403 and b"removed" in body and DATA[:100] not in body


class Cache:
    """What an agent's cache gives its Link: the files held, and a sweep."""

    def __init__(self) -> None:
        self.files = [wire.HeldFile("a" * 64, 10), wire.HeldFile("b" * 64, 20)]
        self.sweeps: list[wire.Sweep] = []

    def held(self) -> list[wire.HeldFile]:
        return list(self.files)

    async def sweep(self, msg: wire.Sweep) -> None:
        self.sweeps.append(msg)
        if not msg.dry_run:
            self.files = [f for f in self.files if f.sha256 not in msg.remove]


async def test_a_node_lists_its_files_and_answers_a_sweep(
    cluster: MirrorCluster, tmp_path: Path, running: Callable[[Link], None]
) -> None:
    cache, holdings = Cache(), cluster.state.holdings
    link = Link(
        cluster.url, node_dir(tmp_path, cluster.ca, "n1"), "n1", version="test",
        inventory=lambda: INVENTORY, replicas=list, on_desired=_ignore, heartbeat_s=0.05,
        held=cache.held, on_sweep=cache.sweep,
    )  # fmt: skip
    cluster.state.set_desired("n1", [])
    running(link)
    await eventually(lambda: holdings.of("n1") == cache.files)
    assert not cluster.state.send_sweep("n2", wire.Sweep(id="s0", remove=[]))

    # A dry run deletes nothing; a sweep deletes and answers with what is left.
    assert cluster.state.send_sweep("n1", wire.Sweep(id="s1", remove=["a" * 64], dry_run=True))
    assert await holdings.swept("n1", "s1", timeout=5) == cache.files
    assert cluster.state.send_sweep("n1", wire.Sweep(id="s2", remove=["a" * 64]))
    assert await holdings.swept("n1", "s2", timeout=5) == [wire.HeldFile("b" * 64, 20)]
    assert await holdings.swept("n1", "s2", timeout=5) == [wire.HeldFile("b" * 64, 20)]
    assert [s.id for s in cache.sweeps] == ["s1", "s2"]

    # A change of the cache is said at once; a disconnection keeps the list, stale.
    cache.files.append(wire.HeldFile("c" * 64, 30))
    link.holdings_changed()
    await eventually(lambda: holdings.of("n1") == cache.files)
    assert not holdings.stale("n1") and holdings.holders("c" * 64) == ["n1"]
    await cluster.runner.cleanup()
    await eventually(lambda: holdings.stale("n1"))
    assert holdings.of("n1") == cache.files
    # Every new connection says it again.
    await cluster.start(cluster.state, cluster.port)
    await eventually(lambda: not holdings.stale("n1"))
    assert holdings.of("n1") == cache.files


async def test_an_unanswered_sweep_is_none_and_a_removed_nodes_list_goes() -> None:
    holdings = Holdings()
    holdings.update("n1", [wire.HeldFile("a" * 64, 1)])
    assert await holdings.swept("n1", "s1", timeout=0.05) is None
    waiting = asyncio.create_task(holdings.swept("n1", "s2", timeout=5))
    await asyncio.sleep(0)
    holdings.drop("n1")
    assert await waiting is None and holdings.of("n1") is None and holdings.nodes() == []
    assert holdings.of("n2") is None and not holdings.stale("n2")


async def _ignore(_: list[wire.ReplicaSpec]) -> None:
    return None
