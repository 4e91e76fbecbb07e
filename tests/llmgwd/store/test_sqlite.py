"""SqliteStore: the conformance suite in memory and on a file, then what only SQLite does."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgwd.store import sqlite as sqlite_module
from llmgwd.store.base import KV, CompactedError, Store, prefix_end
from llmgwd.store.sqlite import SqliteStore, SqliteStoreError
from tests.llmgwd.store.conformance import StoreConformance, summary, take


@pytest.fixture(params=["memory", "file"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    path = ":memory:" if request.param == "memory" else tmp_path / "store.db"
    opened = await SqliteStore.open(path)
    yield opened
    await opened.close()


class TestSqliteConformance(StoreConformance):
    pass


async def test_data_survives_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    first = await SqliteStore.open(path)
    r1 = await first.put("a", b"1")
    await first.put("a", b"2")
    await first.put("b", b"1")
    _, r4 = await first.delete("b")
    state = await first.range("", prefix_end(""))
    await first.close()

    again = await SqliteStore.open(path)
    try:
        assert await again.range("", prefix_end("")) == state
        assert await again.revision() == r4
        assert await again.get("a") == KV("a", b"2", r1, r1 + 1, 2)
        history = await take(again.watch("", prefix_end(""), start_revision=r1), 4)
        assert [e.kv.mod_revision for e in history] == [r1, r1 + 1, r1 + 2, r4]
        assert await again.put("c", b"1") == r4 + 1
    finally:
        await again.close()


async def test_a_lease_survives_reopen_and_still_expires(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    first = await SqliteStore.open(path)
    lease = await first.lease_grant(0.3)
    await first.put("held", b"x", lease=lease)
    await first.close()

    again = await SqliteStore.open(path)
    try:
        assert await again.lease_keepalive(lease) == pytest.approx(0.3)
        events = again.watch("held", start_revision=await again.revision() + 1)
        assert [e.type for e in await take(events, 1)] == ["delete"]
        assert await again.get("held") is None
    finally:
        await again.close()


async def test_compaction_drops_old_history_but_keeps_recent_reads() -> None:
    store = await SqliteStore.open(":memory:", keep_revisions=5)
    try:
        cold = await store.put("cold", b"c")
        for i in range(20):
            await store.put("hot", str(i).encode())
        now = await store.revision()
        with pytest.raises(CompactedError):
            await anext(store.watch("hot", start_revision=cold))
        with pytest.raises(CompactedError):
            await store.range("cold", revision=cold)
        oldest, _ = await store.range("", prefix_end(""), revision=now - 5)
        assert [(kv.key, kv.value) for kv in oldest] == [("cold", b"c"), ("hot", b"14")]
        kept = await take(store.watch("hot", start_revision=now - 4), 4)
        assert [e.kv.value for e in kept] == [b"15", b"16", b"17", b"18"]
        assert kept[0].prev_kv is not None
        assert kept[0].prev_kv.value == b"14"
    finally:
        await store.close()


async def test_a_long_replay_streams_in_windows_then_goes_live(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sqlite_module, "_WATCH_WINDOW", 3)
    store = await SqliteStore.open(":memory:")
    try:
        first = await store.put("other", b"x")
        revs = [await store.put("k", str(i).encode()) for i in range(10)]
        events = store.watch("k", start_revision=first)
        replayed = await take(events, 10)
        assert [e.kv.mod_revision for e in replayed] == revs
        live = await store.put("k", b"live")
        assert summary(await take(events, 1)) == [("put", "k", b"live", live)]
    finally:
        await store.close()


async def test_the_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = await SqliteStore.open(path)
    await store.put("a", b"1")
    await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_module.SCHEMA_VERSION


async def test_a_file_that_is_not_sqlite_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.write_bytes(b"this is not a database\n" * 200)
    with pytest.raises(SqliteStoreError, match="not a usable llmgw store"):
        await SqliteStore.open(path)


async def test_a_corrupt_store_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = await SqliteStore.open(path)
    await store.put("a", b"1")
    await store.close()
    with path.open("r+b") as f:
        f.write(b"\xde\xad\xbe\xef" * 25)  # over SQLite's 100-byte header
    with pytest.raises(SqliteStoreError, match=str(path)):
        await SqliteStore.open(path)


async def test_another_programs_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE songs (title TEXT)")
    with pytest.raises(SqliteStoreError, match="not an llmgw store"):
        await SqliteStore.open(path)


async def test_a_store_from_a_newer_llmgwd_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    await (await SqliteStore.open(path)).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(SqliteStoreError, match="newer"):
        await SqliteStore.open(path)


async def test_a_closed_store_refuses_work() -> None:
    store = await SqliteStore.open(":memory:")
    await store.close()
    with pytest.raises(RuntimeError, match="closed"):
        await store.get("a")
    with pytest.raises(RuntimeError, match="closed"):
        store.watch("a")


async def test_the_event_loop_keeps_running_during_writes(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "store.db")
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    try:
        await asyncio.gather(*(store.put(f"k{i}", b"x") for i in range(20)))
        assert ticks > 20  # the loop ran between the fsyncing writes
    finally:
        ticker.cancel()
        await store.close()
