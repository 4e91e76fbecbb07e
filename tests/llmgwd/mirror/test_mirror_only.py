"""llmgwd with `mode: mirror`, run as the llmgwd command: huggingface_hub downloads from its /hf
over its own TLS, /v1 says it is a mirror only, no cluster port listens, and a second llmgwd (a
whole control plane) uses it as its mirror.upstream, or one with no way out as a peer, fetching
nothing from the hub itself."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.typedefs import Handler

from llmgwd.mirror import hub_server
from tests.llmgw.test_cli_mirror import GGUF, UP_REPO, Upstream

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Hub:
    """The fake hub: its /hf URL and the files it sent (resolve requests by name)."""

    url: str = ""
    sent: list[str] = field(default_factory=list)


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Hub]:
    found = Hub()

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        if "/resolve/" in request.path:
            found.sent.append(request.path.rpartition("/")[2])
        return await handler(request)

    (tmp_path / "up").mkdir()
    app = web.Application()
    app.add_subapp("/hf", hub_server.hub_app(Upstream(tmp_path / "up"), count))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    found.url = str(server.make_url("/hf"))
    yield found
    await server.close()


@dataclass
class Llmgwd:
    """One llmgwd process: its directory, socket and client port."""

    dir: Path
    port: int
    cluster_port: int
    proc: asyncio.subprocess.Process

    @property
    def socket(self) -> str:
        return str(self.dir / "llmgwd.sock")

    @property
    def hf(self) -> str:
        return f"https://127.0.0.1:{self.port}/hf"

    @property
    def ca(self) -> Path:
        return self.dir / "state" / "pki" / "ca.pem"

    async def llmgw(self, *args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            str(BIN / "llmgw"), "--socket", self.socket, *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        return proc.returncode or 0, out.decode(), err.decode()


def write_config(d: Path, mode: str, upstream: str, token_file: str) -> tuple[int, int]:
    """d/server.yaml, on free loopback ports: the client port's and the cluster port's."""
    d.mkdir()
    port, cluster = free_port(), free_port()
    token = f"\n  token_file: {token_file}" if token_file else ""
    (d / "server.yaml").write_text(
        f"name: {d.name}\nmode: {mode}\nstate_dir: {d}/state\nsocket: {d}/llmgwd.sock\n"
        f"client:\n  listen: 127.0.0.1:{port}\n"
        f"cluster:\n  listen: 127.0.0.1:{cluster}\n  advertise: https://127.0.0.1:{cluster}\n"
        f"mirror:\n  upstream: {upstream}{token}\nnetwork:\n  proxy: none\n"
    )
    return port, cluster


async def start(d: Path, mode: str, upstream: str, token_file: str = "", **env: str) -> Llmgwd:
    """llmgwd with a server.yaml of these settings, once its socket answers."""
    port, cluster = write_config(d, mode, upstream, token_file)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "HF_"))}
    log = os.open(d / "log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "llmgwd"), "--config", str(d / "server.yaml"), env=environ | env,
        stdout=asyncio.subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    os.close(log)  # the child's now
    daemon = Llmgwd(d, port, cluster, proc)
    for _ in range(300):
        if proc.returncode is not None:
            raise RuntimeError(f"llmgwd exited: {(d / 'log').read_text()}")
        if (await daemon.llmgw("status"))[0] == 0:
            return daemon
        await asyncio.sleep(0.1)
    raise RuntimeError(f"llmgwd did not answer: {(d / 'log').read_text()}")


async def stop(daemon: Llmgwd) -> None:
    daemon.proc.terminate()
    await asyncio.wait_for(daemon.proc.wait(), 30)


@pytest.fixture
async def alone(tmp_path: Path, hub: Hub) -> AsyncIterator[tuple[Llmgwd, str]]:
    """The mirror alone, holding the hub's set, and an admin key of its own."""
    daemon = await start(tmp_path / "mirror-a", "mirror", hub.url)
    try:
        rc, key, err = await daemon.llmgw("key", "create", "peers", "--admin")
        assert rc == 0, err
        rc, out, err = await daemon.llmgw("model", "add", "tiny", "--from", f"hf:{UP_REPO}")
        assert rc == 0, out + err
        yield daemon, key.strip()
    finally:
        await stop(daemon)


async def test_huggingface_hub_downloads_from_a_mirror_alone_and_v1_is_refused(
    alone: tuple[Llmgwd, str], tmp_path: Path
) -> None:
    daemon, key = alone
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and "proxy" not in k}
    env |= {"HF_ENDPOINT": daemon.hf, "HF_TOKEN": key, "HF_HOME": str(tmp_path / "hf-home"),
            "SSL_CERT_FILE": str(daemon.ca), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}  # fmt: skip
    code = f"from huggingface_hub import snapshot_download\nprint(snapshot_download({UP_REPO!r}))"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out = (await asyncio.wait_for(proc.communicate(), 120))[0].decode()
    assert proc.returncode == 0, out
    got = Path(out.strip().splitlines()[-1]) / "tiny.Q4_1.gguf"
    assert got.read_bytes() == GGUF.read_bytes()
    trust = ssl.create_default_context(cafile=str(daemon.ca))
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
        url = f"https://127.0.0.1:{daemon.port}/v1/chat/completions"
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(url, json=body, ssl=trust) as r:
            status, answer = r.status, await r.json()
    assert status == 404 and answer["error"]["code"] == "mirror_only"
    assert "mirror only" in answer["error"]["message"]
    rc, out, err = await daemon.llmgw("status")
    assert rc == 0 and "a model mirror alone" in out and "models:   1 in its catalog" in out
    assert "join URL" not in out, out  # nodes join a cluster's control plane
    rc, out, err = await daemon.llmgw("model", "serve", "tiny", "--replicas", "1")
    assert rc != 0 and "mirror only" in err, out + err  # nothing is placed here
    with pytest.raises(OSError):  # no cluster port: nodes have nothing to join
        socket.create_connection(("127.0.0.1", daemon.cluster_port), timeout=2).close()


async def test_a_cluster_uses_the_mirror_alone_as_its_upstream(
    alone: tuple[Llmgwd, str], tmp_path: Path, hub: Hub
) -> None:
    mirror, key = alone
    assert hub.sent == ["tiny.Q4_1.gguf"]  # the mirror alone fetched it
    (tmp_path / "key").write_text(key + "\n")
    cluster = await start(tmp_path / "cluster-b", "cluster", mirror.hf, str(tmp_path / "key"),
                          SSL_CERT_FILE=str(mirror.ca))  # fmt: skip
    try:
        rc, out, err = await cluster.llmgw("model", "add", "tiny", "--from", f"hf:{UP_REPO}")
        assert rc == 0, out + err + (cluster.dir / "log").read_text()
        rc, out, err = await cluster.llmgw("mirror", "status", "--json")
        status = json.loads(out)
        assert (status["files_held"], status["bytes_held"]) == (1, GGUF.stat().st_size)
    finally:
        await stop(cluster)
    assert hub.sent == ["tiny.Q4_1.gguf"]  # the cluster's copy came from the mirror alone


async def test_a_cluster_with_no_way_out_copies_from_the_mirror_alone_as_a_peer(
    alone: tuple[Llmgwd, str], tmp_path: Path, hub: Hub
) -> None:
    mirror, key = alone
    (tmp_path / "key").write_text(key + "\n")
    nowhere = "http://127.0.0.1:9/hf"  # the hub cannot be reached from the GPU network
    cluster = await start(tmp_path / "cluster-c", "cluster", nowhere, SSL_CERT_FILE=str(mirror.ca))
    try:
        rc, out, err = await cluster.llmgw(
            "mirror", "add-peer", mirror.hf, "--token-file", str(tmp_path / "key")
        )
        assert rc == 0, out + err
        for _ in range(100):
            status = json.loads((await cluster.llmgw("mirror", "status", "--json"))[1])
            if status["files_held"]:
                break
            await asyncio.sleep(0.1)
        assert (status["files_held"], status["bytes_held"]) == (1, GGUF.stat().st_size)
        rc, out, err = await cluster.llmgw("model", "add", "tiny", "--from", f"hf:{UP_REPO}")
        assert rc == 0, out + err  # the copied set serves the add, the hub not asked
    finally:
        await stop(cluster)
    assert hub.sent == ["tiny.Q4_1.gguf"]
