"""Backup and restore a piece at a time: a store of several chunks through `llmgw backup`
and `llmgwd restore` comes back whole; a file damaged past its first chunk writes nothing;
a stream cut off leaves no file at FILE; a file of llmgw 0.1 (llmgw-sealed-1) still
restores, and a backup of an llmgwd 0.1 (its JSON bundle) is sealed as ours and restores."""

from __future__ import annotations

import asyncio
import os
import pwd
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import msgspec
import pytest
from aiohttp import web
from click.testing import CliRunner

from llmgw import backup_archive, pki, sealed
from llmgw.api_types import BackupBundle
from llmgw.cli.main import main
from llmgw.config import ServerConfig
from llmgwd.api.access import peercred_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.planes import backup, host_commands
from llmgwd.planes.listing import ControlPlanes
from llmgwd.planes.tokens import PlaneTokens
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw.test_cli import _start_site
from tests.llmgwd.test_backup import PHRASE, fill, restored_state

T = TypeVar("T")
BLOBS = 5  # keys of 1 MiB each: a store of five chunks and more
OLD_FILE = Path(__file__).with_name("sealed-1.backup")  # made as llmgw 0.1 made them
OLD_KEY = "sk-llmgw-RJ4CAyF-1Kek29OlqFFVj5JsZAUjjQql4GseDuQyhvI"  # a key in it, its usage


class Loop:
    """An event loop in a thread, for a site the CLI (in this thread) talks to."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.stop()


def _cli(sock: str, tmp_path: Path, *args: str) -> Any:
    phrase = tmp_path / "phrase"
    phrase.write_text(PHRASE + "\n")
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    argv = ["--socket", sock, *args, "--passphrase-file", str(phrase)]
    return CliRunner().invoke(main, argv, env=env)


def _llmgwd_restore(
    file: Path, fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """`llmgwd restore FILE` as `llmgw restore` runs it, into fresh, as this user."""
    me = pwd.getpwuid(os.getuid())
    monkeypatch.setattr(pwd, "getpwnam", lambda _: me)
    real = backup.restored_config
    monkeypatch.setattr(backup, "restored_config", lambda bundle, _d: real(bundle, fresh))
    phrase = tmp_path / "phrase"
    phrase.write_text(PHRASE + "\n")
    argv = ["restore", str(file), "--passphrase-file", str(phrase), "--config",
            str(fresh / "server.yaml"), "--no-start"]  # fmt: skip
    return CliRunner().invoke(host_commands.host, argv)


async def _blobs(state_dir: Path) -> dict[str, bytes]:
    store = await SqliteStore.open(state_dir / "state.db")
    try:
        kvs, _ = await store.range("/test/blob/", "/test/blob0", limit=0, revision=0)
        return {kv.key: kv.value for kv in kvs}
    finally:
        await store.close()


@pytest.fixture
def big_site(loop: Loop, tmp_path: Path) -> Iterator[tuple[str, str, dict[str, bytes]]]:
    """A control plane whose store is over BLOBS MiB, its API on a socket: the socket, a
    key's secret and the blobs."""
    old = tmp_path / "old"
    old.mkdir()
    store, catalog, key, _ = loop.run(fill(old))
    blobs = {f"/test/blob/{i}": os.urandom(1 << 20) for i in range(BLOBS)}
    for k, v in blobs.items():
        loop.run(store.put(k, v))
    src = backup.Source(store, ServerConfig(name="site", state_dir=str(old)),
                        pki.make_ca("site"), os.urandom(32), "cp1")  # fmt: skip
    planes = ControlPlanes(store, None, PlaneTokens(store, src.ca.cert_pem), "cp1",
                           "https://cp1:7710", backup=src)  # fmt: skip
    ctx = ApiContext(catalog=catalog, nodes=cast(Any, None), mint_token=lambda: "t",
                     join_url="https://cp1:7710", control_planes=planes)  # fmt: skip
    sock = str(tmp_path / "d.sock")
    runner = loop.run(_start_site(api_app(ctx, peercred_auth("llmgw")), sock))
    yield sock, key, blobs
    loop.run(runner.cleanup())
    loop.run(store.close())


def test_a_store_of_several_chunks_comes_back_whole(
    big_site: tuple[str, str, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, key, blobs = big_site
    file = tmp_path / "out" / "cluster.backup"
    file.parent.mkdir()
    r = _cli(sock, tmp_path, "backup", str(file))
    assert r.exit_code == 0, r.output
    assert file.stat().st_size > BLOBS << 20 and os.listdir(file.parent) == ["cluster.backup"]
    assert not [p for p in (tmp_path / "old").iterdir() if p.name.endswith(".backup")]
    fresh = tmp_path / "fresh"
    r = _llmgwd_restore(file, fresh, tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    assert asyncio.run(_blobs(fresh)) == blobs
    assert asyncio.run(restored_state(fresh, key))[0]


def test_a_file_damaged_past_its_first_chunk_writes_nothing(
    big_site: tuple[str, str, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, _, _ = big_site
    file = tmp_path / "cluster.backup"
    assert _cli(sock, tmp_path, "backup", str(file)).exit_code == 0
    damaged = bytearray(file.read_bytes())
    damaged[len(damaged) - (2 << 20)] ^= 1  # in a chunk of the store, its third from last
    file.write_bytes(bytes(damaged))
    fresh = tmp_path / "fresh"
    r = _llmgwd_restore(file, fresh, tmp_path, monkeypatch)
    assert r.exit_code == 1 and "changed since it was made" in r.output, r.output
    assert "nothing was written" in r.output
    assert not (fresh / "server.yaml").exists()
    assert [p for p in fresh.rglob("*") if not p.is_dir()] == []


BUNDLE = BackupBundle(made_at=0.0, cluster="site", plane="cp1", version="0", schema=1,
                      backend="sqlite", keys=1, store=b"", ca_cert_pem="", ca_key_pem="",
                      secret=b"s", settings="")  # fmt: skip


def _cut_site(how: str) -> web.Application:
    """POST /api/v1/backup announcing a store of 3 MiB and sending one: the connection
    broken off, or the answer ended."""

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(backup_archive.head(BUNDLE, 3 << 20) + os.urandom(1 << 20))
        if how == "broken off":
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/api/v1/backup", answer)
    return app


@pytest.mark.parametrize("how", ["broken off", "ended short"])
def test_a_stream_cut_off_leaves_no_file(loop: Loop, tmp_path: Path, how: str) -> None:
    sock = str(tmp_path / "d.sock")
    runner = loop.run(_start_site(_cut_site(how), sock))
    out = tmp_path / "out"
    out.mkdir()
    try:
        r = _cli(sock, tmp_path, "backup", str(out / "cluster.backup"))
    finally:
        loop.run(runner.cleanup())
    assert r.exit_code != 0 and "nothing was written" in r.output, r.output
    assert os.listdir(out) == []


def _llmgwd_0_1(bundle: BackupBundle) -> web.Application:
    """POST /api/v1/backup as llmgwd 0.1 answers it, whatever the Accept: the bundle, its
    store in it, as JSON (its api/backup.py: json_response(bundle))."""

    async def answer(request: web.Request) -> web.Response:
        body = msgspec.json.encode(bundle)
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/api/v1/backup", answer)
    return app


async def _bundle_0_1(old: Path) -> tuple[BackupBundle, str, list[Any]]:
    """A control plane's bundle with its store in it, as llmgwd 0.1 made it; a key, usage."""
    store, _, key, usage = await fill(old)
    try:
        src = backup.Source(store, ServerConfig(name="site", state_dir=str(old)),
                            pki.make_ca("site"), os.urandom(32), "cp1")  # fmt: skip
        async with backup.dump(src) as made:
            data = made.store.read()
        return msgspec.structs.replace(made.bundle, store=data), key, usage
    finally:
        await store.close()


def test_a_backup_of_an_llmgwd_0_1_is_sealed_as_ours_and_restores(
    loop: Loop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mixed releases (a roll, a remote context): llmgw 0.2 backs up an llmgwd 0.1."""
    (tmp_path / "old").mkdir()
    bundle, key, usage = loop.run(_bundle_0_1(tmp_path / "old"))
    sock = str(tmp_path / "d.sock")
    runner = loop.run(_start_site(_llmgwd_0_1(bundle), sock))
    file = tmp_path / "cluster.backup"
    try:
        r = _cli(sock, tmp_path, "backup", str(file))
    finally:
        loop.run(runner.cleanup())
    assert r.exit_code == 0, r.output
    assert "Backed up cluster site, made " in r.output and "control plane cp1" in r.output
    assert file.read_bytes().startswith(b"llmgw-sealed-2\n")
    fresh = tmp_path / "fresh"
    r = _llmgwd_restore(file, fresh, tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    assert (fresh / "secret").read_bytes() == bundle.secret
    assert asyncio.run(restored_state(fresh, key)) == (True, usage)


def test_a_file_of_llmgw_0_1_still_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert OLD_FILE.read_bytes().startswith(b"llmgw-sealed-1\n")
    fresh = tmp_path / "fresh"
    r = _llmgwd_restore(OLD_FILE, fresh, tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    assert "Restoring cluster site, made " in r.output
    verifies, usage = asyncio.run(restored_state(fresh, OLD_KEY))
    assert verifies and usage[0].counts.requests == 1
    with OLD_FILE.open("rb") as f, pytest.raises(sealed.SealError, match="wrong passphrase"):
        sealed.PlainReader(f, PHRASE + "!").read(1)
