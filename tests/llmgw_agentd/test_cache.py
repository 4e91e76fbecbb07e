"""The node's model cache: sets fetched once from the mirror, checked, resumed, linked by path,
swept; and replicas that wait for their files (or fail clearly) before their engine starts."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web

from llmgw.wire import ModelFile, ReplicaSpec
from llmgw_agentd.cache import Cache, FetchError, Mirror
from llmgw_agentd.replicas import Replicas
from tests.llmgw_agentd.test_replicas import KEY, Node, engine_command, ready, until
from tests.llmgw_agentd.test_replicas import node as node  # a fixture

COMMIT = "c" * 40


def blob(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


GGUF = blob(3 << 20, 1)  # 3 MiB
CONFIG = blob(1000, 2)
OTHER = blob(5000, 3)


def mf(path: str, data: bytes) -> ModelFile:
    return ModelFile(path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest())


SET = [mf("sub/model-00001-of-00002.gguf", GGUF), mf("config.json", CONFIG)]


def hf_spec(rid: str = "r1", files: list[ModelFile] = SET, repo: str = "org/smol") -> ReplicaSpec:
    return ReplicaSpec(
        id=rid, model="smol", engine="llama.cpp", source=f"hf:{repo}@{COMMIT}", files=files,
        api_key=KEY,
    )  # fmt: skip


class FakeMirror:
    """The cluster port's /mirror/files route as far as the cache sees it, counting requests;
    it can cut an answer, hold one, change a byte, or not have a file yet."""

    def __init__(self) -> None:
        self.blobs = {hashlib.sha256(d).hexdigest(): d for d in (GGUF, CONFIG, OTHER)}
        self.requests: list[tuple[str, str]] = []  # (sha256, Range header)
        self.cut: dict[str, int] = {}  # the next answer of a file stops at this byte
        self.hold: asyncio.Event | None = None  # ...and waits for this, rather than closing
        self.missing: Counter[str] = Counter()  # 404 this many times first
        self.changed: set[str] = set()  # one byte of these is changed
        self.url = ""

    def gets(self, sha: str) -> int:
        return sum(1 for s, _ in self.requests if s == sha)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        sha = request.match_info["sha256"]
        self.requests.append((sha, request.headers.get("Range", "")))
        if self.missing[sha] > 0:
            self.missing[sha] -= 1
            return web.json_response({"error": "no", "code": "not_in_mirror"}, status=404)
        data = bytearray(self.blobs[sha])
        if sha in self.changed:
            data[len(data) // 2] ^= 1
        start = int(request.headers.get("Range", "bytes=0-")[6:].rstrip("-"))
        resp = web.StreamResponse(status=206 if start else 200)
        resp.content_length = len(data) - start
        if start:
            resp.headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        await resp.prepare(request)
        stop = self.cut.pop(sha, len(data))
        await resp.write(bytes(data[start:stop]))
        if stop < len(data):
            if self.hold is not None:
                await self.hold.wait()
            assert request.transport is not None
            request.transport.close()
            return resp
        await resp.write_eof()
        return resp


@pytest.fixture
async def mirror() -> AsyncIterator[FakeMirror]:
    m = FakeMirror()
    app = web.Application()
    app.router.add_get("/mirror/files/{sha256}", m.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    m.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield m
    if m.hold is not None:
        m.hold.set()
    await runner.cleanup()


@pytest.fixture
async def caches(tmp_path: Path, mirror: FakeMirror) -> AsyncIterator[Callable[[], Cache]]:
    """new() is an agent's cache over tmp_path/models (called again: the agent restarted)."""
    made: list[Cache] = []

    def new() -> Cache:
        c = Cache(tmp_path / "models", lambda: Mirror(mirror.url), retry_s=0.05, tick_s=0.01)
        made.append(c)
        return c

    yield new
    for c in made:
        await c.close()


async def eventually(check: Callable[[], object]) -> None:
    async with asyncio.timeout(10):
        while not check():  # noqa: ASYNC110 (the fetch has no event to wait on)
            await asyncio.sleep(0.01)


async def test_twenty_replicas_of_one_set_fetch_each_file_once(
    caches: Callable[[], Cache], mirror: FakeMirror
) -> None:
    cache = caches()
    dirs = await asyncio.gather(*(cache.ensure(hf_spec(f"r{i}")) for i in range(20)))
    assert set(dirs) == {cache.root / "sets" / "org--smol" / COMMIT}
    assert [mirror.gets(f.sha256) for f in SET] == [1, 1]
    # The set is a real directory of links by path (nested kept) to checked blobs.
    where = dirs[0]
    assert (where / "sub" / "model-00001-of-00002.gguf").read_bytes() == GGUF
    assert (where / "config.json").is_symlink() and (where / "config.json").read_bytes() == CONFIG
    assert sorted(f.sha256 for f in cache.held()) == sorted(f.sha256 for f in SET)
    # Readable by engines' dynamic users.
    for d in (cache.root, cache.root / "sets", where, where / "sub"):
        assert d.stat().st_mode & 0o005 == 0o005, d
    assert (where / "config.json").stat().st_mode & 0o004
    # Asked again: nothing fetched.
    await cache.ensure(hf_spec("r21"))
    assert len(mirror.requests) == 2


async def test_a_cut_answer_is_carried_on_where_it_stopped(
    caches: Callable[[], Cache], mirror: FakeMirror
) -> None:
    gguf = SET[0].sha256
    mirror.cut[gguf] = 1 << 20
    where = await caches().ensure(hf_spec())
    assert (where / SET[0].path).read_bytes() == GGUF
    assert [r for s, r in mirror.requests if s == gguf] == ["", f"bytes={1 << 20}-"]


async def test_an_agent_restarted_mid_fetch_carries_the_partial_on(
    caches: Callable[[], Cache], mirror: FakeMirror
) -> None:
    gguf = SET[0].sha256
    mirror.cut[gguf], mirror.hold = 2 << 20, asyncio.Event()
    first = caches()
    fetching = asyncio.create_task(first.ensure(hf_spec()))
    partial = first.store.partial(gguf)
    await eventually(lambda: partial.exists() and partial.stat().st_size == 2 << 20)
    fetching.cancel()
    await first.close()  # the agent stops; its partial stays
    assert partial.stat().st_size == 2 << 20 and not first.store.has(gguf)

    where = await caches().ensure(hf_spec())
    assert (where / SET[0].path).read_bytes() == GGUF
    assert [r for s, r in mirror.requests if s == gguf] == ["", f"bytes={2 << 20}-"]


async def test_a_file_the_mirror_does_not_have_yet_is_waited_for(
    caches: Callable[[], Cache], mirror: FakeMirror
) -> None:
    mirror.missing[SET[1].sha256] = 3
    said: list[str] = []
    await caches().ensure(hf_spec(), said.append)
    assert mirror.gets(SET[1].sha256) == 4
    assert any("waiting for the mirror" in s for s in said), said


async def test_progress_is_the_whole_sets(caches: Callable[[], Cache], mirror: FakeMirror) -> None:
    mirror.cut[SET[0].sha256], mirror.hold = 1 << 20, asyncio.Event()
    said: list[str] = []
    fetching = asyncio.create_task(caches().ensure(hf_spec(), said.append))
    # The config came whole, and part of the GGUF (up to a third): the set's share, not a file's.
    shape = re.compile(r"fetching 1 file: (\d+)%, ([\d.]+) of 3\.1 MB")

    def part_of_the_set() -> bool:
        m = shape.fullmatch(said[-1]) if said else None
        return m is not None and 0 < int(m[1]) <= 34 and 0 < float(m[2]) <= 1.1

    await eventually(part_of_the_set)
    assert said[0].startswith("fetching 2 files: ")
    mirror.hold.set()
    await fetching


async def test_a_changed_byte_publishes_nothing(
    caches: Callable[[], Cache], mirror: FakeMirror
) -> None:
    mirror.changed.add(SET[0].sha256)
    cache = caches()
    with pytest.raises(FetchError, match="does not check") as e:
        await cache.ensure(hf_spec())
    assert SET[0].sha256 in str(e.value)
    assert not cache.store.has(SET[0].sha256)
    assert not (cache.root / "sets" / "org--smol" / COMMIT / SET[0].path).exists()
    assert len(cache.store.refused()) == 1  # kept aside, once however often it is tried
    with pytest.raises(FetchError):
        await cache.ensure(hf_spec())
    assert len(cache.store.refused()) == 1


async def test_disk_full_is_said_before_a_byte_is_fetched(
    caches: Callable[[], Cache], mirror: FakeMirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = caches()
    monkeypatch.setattr(cache.store, "free", lambda: 2_000_000)
    with pytest.raises(FetchError) as e:
        await cache.ensure(hf_spec())
    assert str(e.value) == f"disk full on {cache.root}: needs 3.1 MB more, 2.0 MB free"
    assert mirror.requests == [] and cache.held() == []


async def test_a_disk_mounted_over_the_cache_while_the_agent_runs_is_filled(
    caches: Callable[[], Cache], mirror: FakeMirror
) -> None:
    cache = caches()
    # What a new, empty disk mounted at the cache's directory looks like: no blobs/, partial/
    # or sets/ under it (the agent made them when it started, on the disk below).
    for d in (cache.store.blobs, cache.store.partials, cache.sets):
        d.rmdir()
    where = await cache.ensure(hf_spec())
    assert (where / SET[0].path).read_bytes() == GGUF
    assert sorted(f.sha256 for f in cache.held()) == sorted(f.sha256 for f in SET)
    for d in (cache.store.blobs, cache.store.partials, cache.sets):
        assert d.stat().st_mode & 0o777 == 0o755, d


async def test_a_sweep_keeps_what_replicas_use_and_removes_links_as_links(
    caches: Callable[[], Cache], mirror: FakeMirror, tmp_path: Path
) -> None:
    cache = caches()
    kept = hf_spec("r1")
    gone = hf_spec("r2", [mf("other.bin", OTHER), SET[1]], repo="org/other")
    await cache.ensure(kept)
    old = await cache.ensure(gone)
    outside = tmp_path / "outside"
    outside.write_text("not the cache's")
    (old / "elsewhere").symlink_to(outside)
    every = [f.sha256 for f in cache.held()]

    await cache.sweep(every, [kept], dry_run=True)
    assert [f.sha256 for f in cache.held()] == every and old.is_dir()

    await cache.sweep(every, [kept], dry_run=False)
    assert sorted(f.sha256 for f in cache.held()) == sorted(f.sha256 for f in SET)
    assert not old.exists() and not old.parent.exists()  # the set went whole
    assert outside.read_text() == "not the cache's"  # a link is removed as a link
    where = cache.set_dir(kept)
    assert (where / "config.json").read_bytes() == CONFIG  # shared with the other set: kept


# Replicas: the engine waits for its set, and is not started without it.


def replicas_with(node: Node, cache: Cache, seen: list[ReplicaSpec]) -> Replicas:
    def command(spec: ReplicaSpec, host: str, port: int, key: str | None) -> list[str]:
        seen.append(spec)
        return engine_command(spec, host, port, key)

    r = Replicas(
        node.config, bus_address=node.address, runtime_dir=node.tmp / "run", command=command,
        probe_interval=0.05, backoff=(0.1, 0.4), cache=cache, fetch_backoff=(0.05, 0.1),
    )  # fmt: skip
    node.made.append(r)
    return r


async def test_a_replica_starts_from_the_cache_which_it_sees_read_only(
    node: Node, caches: Callable[[], Cache], mirror: FakeMirror
) -> None:
    cache, seen = caches(), list[ReplicaSpec]()
    replicas = replicas_with(node, cache, seen)
    await replicas.start()
    await replicas.apply([hf_spec()])
    await until(replicas, ready())
    gguf = cache.set_dir(hf_spec()) / "sub" / "model-00001-of-00002.gguf"
    assert [s.source for s in seen] == [f"file:{gguf}"]
    props = node.fake.units["llmgw-engine-r1.service"].properties
    assert props["ReadOnlyPaths"] == [f"-{cache.root}"]


async def test_a_replica_whose_file_does_not_check_fails_and_no_engine_starts(
    node: Node, caches: Callable[[], Cache], mirror: FakeMirror
) -> None:
    mirror.changed.add(SET[0].sha256)
    cache, seen = caches(), list[ReplicaSpec]()
    replicas = replicas_with(node, cache, seen)
    await replicas.start()
    await replicas.apply([hf_spec()])
    got = (await until(replicas, lambda s: s["r1"].state == "failed"))["r1"]
    assert "the mirror's copy does not check" in got.message and "trying again" in got.message
    await until(replicas, lambda s: mirror.gets(SET[0].sha256) >= 2)  # tried again later
    assert node.fake.started == [] and seen == [] and not cache.store.has(SET[0].sha256)


async def test_a_full_disk_fails_the_replica_clearly(
    node: Node, caches: Callable[[], Cache], mirror: FakeMirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = caches()
    monkeypatch.setattr(cache.store, "free", lambda: 500)
    replicas = replicas_with(node, cache, [])
    await replicas.start()
    await replicas.apply([hf_spec()])
    got = (await until(replicas, lambda s: s["r1"].state == "failed"))["r1"]
    assert got.message.startswith(f"disk full on {cache.root}: needs 3.1 MB more, 500 bytes free")
    assert node.fake.started == [] and mirror.requests == []
    monkeypatch.setattr(cache.store, "free", lambda: 1 << 40)  # space is made: it goes on
    await until(replicas, ready())


async def test_a_sweep_keeps_the_files_of_a_replica_being_fetched(
    node: Node, caches: Callable[[], Cache], mirror: FakeMirror
) -> None:
    mirror.cut[SET[0].sha256], mirror.hold = 1 << 20, asyncio.Event()
    cache = caches()
    replicas = replicas_with(node, cache, [])
    await replicas.start()
    await replicas.apply([hf_spec()])
    await eventually(lambda: cache.store.has(SET[1].sha256))
    await cache.sweep([SET[1].sha256], replicas.specs(), dry_run=False)
    assert cache.store.has(SET[1].sha256)
    mirror.hold.set()
    await until(replicas, ready())
    assert [s.message for s in replicas.statuses()] == [""]
    assert (cache.set_dir(hf_spec()) / "config.json").read_bytes() == CONFIG


async def test_progress_says_verifying_while_a_resumed_partial_is_checked(
    caches: Callable[[], Cache], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = caches()
    checking = {SET[0].sha256}
    monkeypatch.setattr(cache._downloads, "verifying", lambda key: key in checking)
    said = cache._progress(SET, SET, set())
    assert said.endswith(f"; verifying {SET[0].path}"), said
    checking.clear()
    assert "verifying" not in cache._progress(SET, SET, set())


@pytest.fixture
async def second() -> AsyncIterator[FakeMirror]:
    """Another control plane's cluster port, with every file."""
    m = FakeMirror()
    app = web.Application()
    app.router.add_get("/mirror/files/{sha256}", m.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    m.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield m
    await runner.cleanup()


async def test_a_control_plane_lacking_a_file_sends_the_agent_to_the_next(
    tmp_path: Path, mirror: FakeMirror, second: FakeMirror
) -> None:
    for f in SET:
        mirror.missing[f.sha256] = 1000  # the linked control plane never got the set
    cache = Cache(
        tmp_path / "models", lambda: Mirror(mirror.url, others=(second.url,)), retry_s=0.05
    )
    try:
        where = await cache.ensure(hf_spec())
    finally:
        await cache.close()
    assert (where / SET[0].path).read_bytes() == GGUF
    assert [mirror.gets(f.sha256) for f in SET] == [1, 1]
    assert [second.gets(f.sha256) for f in SET] == [1, 1]


async def test_a_file_no_control_plane_has_yet_is_waited_for_on_all(
    tmp_path: Path, mirror: FakeMirror, second: FakeMirror
) -> None:
    sha = SET[1].sha256
    mirror.missing[sha], second.missing[sha] = 1000, 2
    said: list[str] = []
    cache = Cache(
        tmp_path / "models",
        lambda: Mirror(mirror.url, others=(second.url,)),
        retry_s=0.05,
        tick_s=0.01,
    )
    try:
        await cache.ensure(hf_spec(), said.append)
    finally:
        await cache.close()
    assert second.gets(sha) == 3 and mirror.gets(sha) == 3
    assert any("waiting for the mirror" in s for s in said), said


async def test_a_control_plane_that_cannot_be_reached_is_passed_over(
    tmp_path: Path, second: FakeMirror
) -> None:
    dead = "http://127.0.0.1:1"  # nothing listens: connection refused
    cache = Cache(tmp_path / "models", lambda: Mirror(dead, others=(second.url,)), retry_s=0.05)
    try:
        where = await cache.ensure(hf_spec())
    finally:
        await cache.close()
    assert (where / "config.json").read_bytes() == CONFIG
    assert [second.gets(f.sha256) for f in SET] == [1, 1]
