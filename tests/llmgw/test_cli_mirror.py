"""llmgw mirror import|status|sweep and model add --from hf: as a person runs them: the
whole set's progress on stderr while the mirror fetches, the answer on stdout; over the Unix
socket and over HTTPS (a context with an admin key, the CA pinned)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.typedefs import Handler
from click.testing import CliRunner, Result

from llmgw.cli.main import main
from llmgw.cli.output import size
from llmgw.wire import ModelFile
from llmgwd.api.access import key_auth, peercred_auth
from llmgwd.api.base import ApiContext, NodeInfo
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog
from llmgwd.mirror import hub_server, setup
from llmgwd.mirror.records import Records
from llmgwd.mirror.service import Mirror, Settings
from llmgwd.mirror.snapshot import Snapshot
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw.https_site import ADMIN_SECRET, WithAdmin, add_context, make_tls, start_tls_site

GGUF = Path(__file__).resolve().parents[1] / "llmgwd/gguf/smollm2-135m-instruct-q4_1.copied.gguf"
UP_REPO, COMMIT = "up/tiny", hashlib.sha1(b"up").hexdigest()


class Upstream:
    """A hub with one repository, whose files come after a pause (a slow link)."""

    def __init__(self, root: Path) -> None:
        data = GGUF.read_bytes()
        self.sha = hashlib.sha256(data).hexdigest()
        (root / self.sha).write_bytes(data)
        self.root = root
        f = ModelFile("tiny.Q4_1.gguf", len(data), self.sha)
        self.snap = Snapshot(repo=UP_REPO, commit=COMMIT, files=[f])

    def snapshot(self, repo: str, revision: str) -> Snapshot | None:
        return self.snap if repo == UP_REPO else None

    def blob(self, sha256: str) -> Path | None:
        return self.root / sha256 if sha256 == self.sha else None


@web.middleware
async def slow(request: web.Request, handler: Handler) -> web.StreamResponse:
    if "/resolve/" in request.path:
        await asyncio.sleep(1.5)
    return await handler(request)


class Daemon:
    """llmgwd's API with a mirror, on a loop in a background thread."""

    def __init__(self, tmp: Path, transport: str) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.socket = str(tmp / "d.sock")
        self.tmp = tmp
        self.transport = transport
        self.env = {"XDG_CONFIG_HOME": str(tmp / "config")}

    def run(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)  # type: ignore[arg-type]

    async def start(self) -> None:
        (self.tmp / "up").mkdir()
        up = web.Application()
        up.add_subapp("/hf", hub_server.hub_app(Upstream(self.tmp / "up"), slow))
        self.upstream = TestServer(up, host="127.0.0.1")
        await self.upstream.start_server()
        self.store = await SqliteStore.open(":memory:")
        self.catalog = Catalog(self.store)
        await self.catalog.load()
        hf = str(self.upstream.make_url("/hf"))
        self.mirror = Mirror(Settings(dir=self.tmp / "mirror", upstream=hf), Records(self.store))
        await self.mirror.start()
        setup.follow_catalog(self.mirror, self.catalog)
        ctx = ApiContext(
            catalog=self.catalog,
            nodes=NoNodes(),
            mint_token=lambda: "t",
            join_url="https://cp:7710",
            mirror=self.mirror,
        )
        if self.transport == "https":
            await self._start_https(ctx)
            return
        self.runner = web.AppRunner(api_app(ctx, peercred_auth("llmgw")))
        await self.runner.setup()
        await web.UnixSite(self.runner, self.socket).start()

    async def _start_https(self, ctx: ApiContext) -> None:
        tls = make_tls(self.tmp)
        app = api_app(ctx, key_auth(WithAdmin(self.catalog)))
        self.runner, self.url = await start_tls_site(app, tls.server)
        self.fingerprint = tls.fingerprint

    def add_context(self) -> None:
        """Over HTTPS, the commands' context (off the loop: the CLI's handshake needs it)."""
        if self.transport == "https":
            (self.tmp / "admin.key").write_text(ADMIN_SECRET)
            add_context(self.tmp / "config", "test", self.url, "--ca-fingerprint",
                        self.fingerprint, "--key-file", str(self.tmp / "admin.key"))  # fmt: skip
            self.env["LLMGW_CONTEXT"] = "test"

    async def stop(self) -> None:
        await self.runner.cleanup()
        await self.mirror.close()
        await self.upstream.close()
        await self.store.close()

    def cli(self, *args: str) -> Result:
        return CliRunner().invoke(main, ["--socket", self.socket, *args], env=self.env)


class NoNodes:
    def nodes(self) -> list[NodeInfo]:
        return []


@pytest.fixture(params=["socket", "https"])
def daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    d = Daemon(tmp_path, request.param)
    d.run(d.start())
    d.add_context()
    yield d
    d.run(d.stop())
    d.loop.call_soon_threadsafe(d.loop.stop)


def test_model_add_shows_the_sets_progress_then_the_answer(daemon: Daemon) -> None:
    r = daemon.cli("model", "add", "tiny", "--from", f"hf:{UP_REPO}")
    assert r.exit_code == 0, r.output
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith(f"{UP_REPO}: ") and "0/1 files" in lines[0]  # while it fetched
    assert "100.0%" in lines[-1] and "1/1 files" in lines[-1]
    assert f"Pinned hf:{UP_REPO}@{COMMIT}: 1 files, {size(GGUF.stat().st_size)}." in r.stdout
    held = daemon.cli("mirror", "status", "--json")
    status = json.loads(held.stdout)
    assert (status["files_held"], status["bytes_held"]) == (1, GGUF.stat().st_size)


def test_import_then_add_then_sweep_and_remove(daemon: Daemon, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "model.gguf").write_bytes(GGUF.read_bytes())
    (src / "sub" / "notes.json").write_text('{"a": 1}\n')
    r = daemon.cli("mirror", "import", str(src), "--as", "local/tiny")
    assert r.exit_code == 0, r.output
    assert (
        "Imported 2 files" in r.stdout and "llmgw model add NAME --from hf:local/tiny" in r.stdout
    )
    assert daemon.cli("model", "add", "tiny", "--from", "hf:local/tiny").exit_code == 0
    dry = daemon.cli("mirror", "sweep", "--dry-run")
    assert f"mirror: 1 files, would free {size(9)}" in dry.stdout  # notes.json: no model uses it
    r = daemon.cli("model", "remove", "tiny", "--files", "--yes")
    assert r.exit_code == 0, r.output
    assert f"mirror: 1 files deleted, {size(GGUF.stat().st_size)} freed" in r.stdout
    status = json.loads(daemon.cli("mirror", "status", "--json").stdout)
    assert status["files_held"] == 1  # the notes, until a sweep


@pytest.mark.parametrize("daemon", ["socket"], indirect=True)  # the route itself, once
def test_an_upload_that_does_not_check_is_refused(daemon: Daemon) -> None:
    sha = hashlib.sha256(b"what was hashed").hexdigest()
    import http.client

    from llmgw import ipc

    conn = ipc.UnixHTTPConnection(daemon.socket)
    conn.request(
        "PUT",
        f"/api/v1/mirror/uploads/{sha}",
        body=b"other bytes!!!!",
        headers={"Content-Length": "15"},
    )
    resp = conn.getresponse()
    body = json.loads(resp.read())
    assert resp.status == 400 and body["error"]["code"] == "checksum_mismatch"
    assert not list((daemon.tmp / "mirror" / "blobs").iterdir())
    assert isinstance(conn, http.client.HTTPConnection)
