"""llmgw.download against a local server that cuts, stalls, changes bytes, fails and redirects."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import subprocess
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw import blobstore, download
from llmgw.blobstore import BlobStore, ChecksumMismatch, DiskFull
from llmgw.download import DownloadError, Downloads, fetch, partial_key
from llmgw.wire import ModelFile

TOKEN = "hf_SeCrEtToKeN"
SIGNATURE = "X-Amz-Signature=s3cr3t"


class Upstream:
    """Serves files with ranges; faults are set per test, and what it sent is counted."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.port = 0
        self.sent = 0  # body bytes written, all answers together
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # (host, path, headers)
        self.fail = 0  # answer this many requests with a 500 first
        self.status = 0  # answer every request with this status
        self.cut_at: list[int] = []  # next answers: close the connection after N body bytes
        self.stall_at: list[int] = []  # next answers: stop sending after N body bytes
        self.ignore_range = False
        self.refuse_range = False  # a 416 to any Range
        self.gate: asyncio.Event | None = None  # answers wait for it before the body
        self.release = asyncio.Event()  # ends stalled answers at teardown
        self.asked = asyncio.Event()  # a request for a file came

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/f/{name}", self.file)
        app.router.add_get("/away/{name}", self.away)
        app.router.add_get("/here/{name}", self.here)
        return app

    async def away(self, request: web.Request) -> web.Response:
        self.requests.append((request.host, request.path, dict(request.headers)))
        url = f"http://localhost:{self.port}/f/{request.match_info['name']}?{SIGNATURE}"
        return web.Response(status=302, headers={"Location": url})

    async def here(self, request: web.Request) -> web.Response:
        self.requests.append((request.host, request.path, dict(request.headers)))
        return web.Response(status=307, headers={"Location": f"/f/{request.match_info['name']}"})

    async def file(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.host, request.path, dict(request.headers)))
        self.asked.set()
        if self.fail:
            self.fail -= 1
            return web.Response(status=500)
        data = self.files.get(request.match_info["name"])
        if self.status or data is None:
            return web.Response(status=self.status or 404)
        status, start, headers = 200, 0, {}
        rng = request.headers.get("Range")
        if rng and self.refuse_range:
            return web.Response(status=416)
        if rng and not self.ignore_range:
            start = int(rng.removeprefix("bytes=").removesuffix("-"))
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = len(data) - start
        await resp.prepare(request)
        if self.gate is not None:
            await self.gate.wait()
        await self.body(request, resp, data[start:])
        return resp

    async def body(self, request: web.Request, resp: web.StreamResponse, body: bytes) -> None:
        cut = self.cut_at.pop(0) if self.cut_at else None
        stall = self.stall_at.pop(0) if self.stall_at else None
        limit = min(x for x in (cut, stall, len(body)) if x is not None)
        for i in range(0, limit, 1 << 16):
            piece = body[i : min(i + (1 << 16), limit)]
            await resp.write(piece)
            self.sent += len(piece)
        if limit == cut:
            assert request.transport is not None
            request.transport.close()  # flushes what was written, then closes
        elif limit == stall:
            await self.release.wait()
        else:
            await resp.write_eof()


@pytest.fixture(autouse=True, params=[False, True], ids=["inline", "offload"])
def offload(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test twice: chunks hashed and written by the loop, and in a thread."""
    monkeypatch.setattr(download, "OFFLOAD", request.param)


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    server = TestServer(up.app(), host="127.0.0.1")
    await server.start_server()
    assert server.port is not None
    up.port = server.port
    yield up
    up.release.set()
    await server.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "store")


def model_file(data: bytes, path: str = "model.gguf") -> ModelFile:
    return ModelFile(path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest())


def url(up: Upstream, name: str, route: str = "f") -> str:
    return f"http://127.0.0.1:{up.port}/{route}/{name}"


def published(store: BlobStore) -> list[str]:
    return sorted(os.listdir(store.blobs))


async def test_a_file_is_fetched_checked_and_published_readable_by_all(
    upstream: Upstream, session: aiohttp.ClientSession, store: BlobStore
) -> None:
    data = os.urandom(3 << 20)
    upstream.files["m"] = data
    want = model_file(data)
    done: list[int] = []

    sha = await fetch(session, url(upstream, "m"), store, want, progress=done.append)

    assert sha == want.sha256
    assert store.path(sha).read_bytes() == data
    assert store.path(sha).stat().st_mode & 0o777 == 0o644
    assert os.listdir(store.partials) == []
    assert done[-1] == len(data) and done == sorted(done)
    # Held already: no request at all.
    await fetch(session, url(upstream, "m"), store, want)
    assert len(upstream.requests) == 1


async def test_a_cut_connection_resumes_without_fetching_the_bytes_before_the_cut(
    upstream: Upstream,
    session: aiohttp.ClientSession,
    store: BlobStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = os.urandom(3 << 20)
    upstream.files["m"] = data
    upstream.cut_at = [1_000_000, 2_000_000]

    with caplog.at_level(logging.INFO, logger="llmgw.download"):
        sha = await fetch(session, url(upstream, "m"), store, model_file(data), backoff_s=0.01)

    assert store.path(sha).read_bytes() == data
    ranges = [h.get("Range") for _, _, h in upstream.requests]
    assert ranges == [None, "bytes=1000000-", "bytes=3000000-"]
    assert upstream.sent == len(data)
    # what the journal says: every byte came over the wire once, across the cuts
    assert f"{len(data)} bytes (0 resumed, {len(data)} received)" in caplog.text


async def test_a_partial_left_by_a_stopped_fetch_is_carried_on(
    upstream: Upstream, session: aiohttp.ClientSession, store: BlobStore
) -> None:
    data = os.urandom(2 << 20)
    upstream.files["m"] = data
    want = model_file(data)
    store.partial(partial_key(want)).write_bytes(data[:700_000])
    done: list[int] = []

    await fetch(session, url(upstream, "m"), store, want, progress=done.append)

    assert store.path(want.sha256).read_bytes() == data
    assert [h.get("Range") for _, _, h in upstream.requests] == ["bytes=700000-"]
    assert upstream.sent == len(data) - 700_000
    assert done[0] == 700_000 and done[-1] == len(data)


async def test_a_stalled_answer_is_a_cut_connection(
    upstream: Upstream, session: aiohttp.ClientSession, store: BlobStore
) -> None:
    data = os.urandom(1 << 20)
    upstream.files["m"] = data
    upstream.stall_at = [300_000]

    await fetch(session, url(upstream, "m"), store, model_file(data), stall_s=0.3, backoff_s=0.01)

    assert store.path(hashlib.sha256(data).hexdigest()).read_bytes() == data
    assert [h.get("Range") for _, _, h in upstream.requests] == [None, "bytes=300000-"]


async def test_a_changed_byte_is_refused_and_kept_with_nothing_published(
    upstream: Upstream, session: aiohttp.ClientSession, store: BlobStore
) -> None:
    data = os.urandom(1 << 20)
    changed = bytearray(data)
    changed[123_456] ^= 1
    upstream.files["m"] = bytes(changed)
    want = model_file(data, "sub/model.gguf")

    with pytest.raises(ChecksumMismatch) as e:
        await fetch(session, url(upstream, "m"), store, want)
    assert "sub/model.gguf" in str(e.value)
    assert want.sha256 in str(e.value)
    assert hashlib.sha256(changed).hexdigest() in str(e.value)
    assert published(store) == []
    assert [p.read_bytes() for p in store.refused()] == [bytes(changed)]

    # Asked again: refused again, and the first refused file is still there.
    with pytest.raises(ChecksumMismatch):
        await fetch(session, url(upstream, "m"), store, want)
    assert len(store.refused()) == 2
    assert published(store) == []


async def test_a_404_is_an_error_at_once_naming_the_file_and_not_the_token(
    upstream: Upstream, session: aiohttp.ClientSession, store: BlobStore
) -> None:
    want = ModelFile(path="org/none.gguf", size=10, sha256="0" * 64)
    with pytest.raises(DownloadError) as e:
        await fetch(
            session,
            url(upstream, "none"),
            store,
            want,
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    assert e.value.status == 404
    assert "404" in str(e.value) and "org/none.gguf" in str(e.value)
    assert TOKEN not in str(e.value)
    assert len(upstream.requests) == 1


async def test_5xx_answers_are_retried_then_given_up(
    upstream: Upstream,
    session: aiohttp.ClientSession,
    store: BlobStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = b"x" * 1000
    upstream.files["m"] = data
    upstream.fail = 3
    caplog.set_level(logging.INFO, "llmgw.download")

    await fetch(session, url(upstream, "m"), store, model_file(data), backoff_s=0.01)
    assert len(upstream.requests) == 4
    assert sum("try" in r.getMessage() and "500" in r.getMessage() for r in caplog.records) == 3

    upstream.status = 503
    other = model_file(b"y" * 10)
    with pytest.raises(DownloadError, match="gave up after 3 tries"):
        await fetch(session, url(upstream, "m"), store, other, attempts=3, backoff_s=0.01)
    assert len(upstream.requests) == 7


async def test_authorization_is_not_sent_to_another_host_after_a_redirect(
    upstream: Upstream,
    session: aiohttp.ClientSession,
    store: BlobStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = os.urandom(100_000)
    upstream.files["m"] = data
    caplog.set_level(logging.DEBUG, "llmgw")
    auth = {"Authorization": f"Bearer {TOKEN}"}

    await fetch(session, url(upstream, "m", "away"), store, model_file(data), headers=auth)

    (h1, p1, first), (h2, p2, second) = upstream.requests
    assert (h1, p1) == (f"127.0.0.1:{upstream.port}", "/away/m")
    assert (h2, p2) == (f"localhost:{upstream.port}", "/f/m")
    assert first["Authorization"] == f"Bearer {TOKEN}"
    assert "Authorization" not in second
    ours = " ".join(r.getMessage() for r in caplog.records if r.name.startswith("llmgw"))
    assert "fetched model.gguf" in ours
    assert TOKEN not in ours and SIGNATURE not in ours

    # The same host keeps it.
    other = os.urandom(1000)
    upstream.files["o"] = other
    await fetch(session, url(upstream, "o", "here"), store, model_file(other), headers=auth)
    assert upstream.requests[-1][2]["Authorization"] == f"Bearer {TOKEN}"


async def test_a_full_answer_to_a_range_or_a_416_starts_from_byte_0(
    upstream: Upstream, session: aiohttp.ClientSession, store: BlobStore
) -> None:
    data = os.urandom(500_000)
    upstream.files["m"] = data
    want = model_file(data)
    store.partial(partial_key(want)).write_bytes(data[:100_000])
    upstream.ignore_range = True
    await fetch(session, url(upstream, "m"), store, want)
    assert store.path(want.sha256).read_bytes() == data

    want2 = model_file(data[:400_000])
    upstream.files["m2"] = data[:400_000]
    store.partial(partial_key(want2)).write_bytes(data[:100_000])
    upstream.ignore_range, upstream.refuse_range = False, True
    await fetch(session, url(upstream, "m2"), store, want2)
    assert store.path(want2.sha256).read_bytes() == data[:400_000]
    assert [h.get("Range") for _, p, h in upstream.requests if p == "/f/m2"] == [
        "bytes=100000-",
        None,
    ]


async def test_an_upstream_file_of_another_size_is_a_clear_error(
    upstream: Upstream, session: aiohttp.ClientSession, store: BlobStore
) -> None:
    upstream.files["m"] = os.urandom(2000)
    want = model_file(os.urandom(1000))
    with pytest.raises(DownloadError, match="2000 bytes"):
        await fetch(session, url(upstream, "m"), store, want)
    assert published(store) == []


async def test_disk_full_before_the_start_is_a_clear_error(
    upstream: Upstream,
    session: aiohttp.ClientSession,
    store: BlobStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = os.urandom(10_000)
    upstream.files["m"] = data
    real = os.statvfs(store.root)

    class Full:
        f_bavail, f_frsize = 1, real.f_frsize

    monkeypatch.setattr(os, "statvfs", lambda _path: Full())
    with pytest.raises(DiskFull, match=f"needs 10000 bytes more on {store.root}"):
        await fetch(session, url(upstream, "m"), store, model_file(data))
    assert upstream.requests == [] and published(store) == []


async def test_disk_full_while_writing_leaves_nothing_published_and_resumes_later(
    upstream: Upstream,
    session: aiohttp.ClientSession,
    store: BlobStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = os.urandom(3 << 20)
    upstream.files["m"] = data
    want = model_file(data)
    part = store.partial(partial_key(want))
    real_write = os.write

    def write(fd: int, chunk: bytes | memoryview) -> int:
        if os.fstat(fd).st_size + len(chunk) > 1 << 20:
            raise OSError(28, "No space left on device")
        return real_write(fd, chunk)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(DiskFull, match="no space left writing"):
        await fetch(session, url(upstream, "m"), store, want)
    assert published(store) == []
    kept = part.stat().st_size
    assert 0 < kept <= 1 << 20 and part.read_bytes() == data[:kept]

    monkeypatch.setattr(os, "write", real_write)
    await fetch(session, url(upstream, "m"), store, want)
    assert store.path(want.sha256).read_bytes() == data
    assert upstream.requests[-1][2]["Range"] == f"bytes={kept}-"


async def test_twenty_callers_of_one_file_make_one_request(
    upstream: Upstream, session: aiohttp.ClientSession, store: BlobStore
) -> None:
    data = os.urandom(1 << 20)
    upstream.files["m"] = data
    upstream.gate = asyncio.Event()
    want = model_file(data)
    downloads = Downloads(store)

    callers = [
        asyncio.create_task(downloads.get(session, url(upstream, "m"), want)) for _ in range(20)
    ]
    await upstream.asked.wait()
    assert downloads.progress(partial_key(want)) == (0, len(data))
    callers[0].cancel()
    await asyncio.sleep(0.01)
    upstream.gate.set()
    results = await asyncio.gather(*callers[1:])

    assert results == [want.sha256] * 19
    assert callers[0].cancelled()
    assert len(upstream.requests) == 1
    assert downloads.progress(partial_key(want)) is None
    assert store.path(want.sha256).read_bytes() == data


def git_hash_object(data: bytes) -> str:
    return (
        subprocess.run(
            ["git", "hash-object", "--stdin"], input=data, capture_output=True, check=True
        )
        .stdout.decode()
        .strip()
    )


async def test_a_file_known_by_its_git_blob_id_is_checked_by_it(
    upstream: Upstream, session: aiohttp.ClientSession, store: BlobStore
) -> None:
    data = b'{"architectures": ["LlamaForCausalLM"]}\n'
    oid = git_hash_object(data)
    assert blobstore.git_blob_id(data) == oid
    upstream.files["config.json"] = data

    want = ModelFile(path="config.json", size=len(data), git_oid=oid)
    sha = await fetch(session, url(upstream, "config.json"), store, want)
    assert sha == hashlib.sha256(data).hexdigest()
    assert store.path(sha).read_bytes() == data

    wrong = ModelFile(path="config.json", size=len(data), git_oid=git_hash_object(b"other"))
    upstream.files["c2"] = data
    store.remove(sha)
    with pytest.raises(ChecksumMismatch, match="git blob id expected"):
        await fetch(session, url(upstream, "c2"), store, wrong)
    assert published(store) == []


class GatedResume:
    """Writer.resume, whose first call in a thread waits until `opened` is set (by the test's
    loop): a resume run on the loop would wait in vain and the test would see it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opened = threading.Event()
        self.started = threading.Event()
        self.calls = 0
        real = blobstore.Writer.resume

        def resume(w: blobstore.Writer, limit: int | None = None) -> bool:
            self.calls += 1
            self.started.set()
            self.opened.wait(timeout=10)
            return real(w, limit)

        monkeypatch.setattr(blobstore.Writer, "resume", resume)


async def test_a_resumed_partial_is_verified_off_the_loop_and_said_so(
    upstream: Upstream,
    session: aiohttp.ClientSession,
    store: BlobStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = os.urandom(24 << 20)
    upstream.files["m"] = data
    want = model_file(data)
    kept = 20 << 20
    store.partial(partial_key(want)).write_bytes(data[:kept])
    monkeypatch.setattr(download, "VERIFY_STEP", 4 << 20)
    gate = GatedResume(monkeypatch)
    downloads = Downloads(store)
    said: list[bool] = []
    done: list[int] = []
    ticks_verifying = 0

    async def ticker() -> None:
        nonlocal ticks_verifying
        while True:
            await asyncio.sleep(0.01)
            if downloads.verifying(partial_key(want)):
                ticks_verifying += 1
                if ticks_verifying >= 3:
                    gate.opened.set()

    ticking = asyncio.create_task(ticker())
    try:
        sha = await downloads.get(
            session, url(upstream, "m"), want, progress=done.append, verifying=said.append
        )
    finally:
        ticking.cancel()

    assert sha == want.sha256 and store.path(sha).read_bytes() == data
    assert said == [True, False]
    assert ticks_verifying >= 3  # the loop ran while the partial was hashed
    assert gate.calls == 5  # 20 MiB in steps of 4 MiB, the last one finding the end
    assert not downloads.verifying(partial_key(want))
    assert done[0] == kept and done[-1] == len(data)
    assert [h.get("Range") for _, _, h in upstream.requests] == [f"bytes={kept}-"]
    assert upstream.sent == len(data) - kept


async def test_a_fetch_cancelled_while_verifying_leaves_its_partial_whole(
    upstream: Upstream,
    session: aiohttp.ClientSession,
    store: BlobStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = os.urandom(12 << 20)
    upstream.files["m"] = data
    want = model_file(data)
    partial = store.partial(partial_key(want))
    partial.write_bytes(data[: 8 << 20])
    monkeypatch.setattr(download, "VERIFY_STEP", 4 << 20)
    gate = GatedResume(monkeypatch)

    task = asyncio.create_task(fetch(session, url(upstream, "m"), store, want))
    await asyncio.to_thread(gate.started.wait, 10)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()  # it waits for the step in its thread, which holds the file
    gate.opened.set()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert partial.stat().st_size == 8 << 20
    assert upstream.requests == []
    await fetch(session, url(upstream, "m"), store, want)
    assert store.path(want.sha256).read_bytes() == data
    assert upstream.sent == 4 << 20
