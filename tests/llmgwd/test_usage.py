"""The usage counter: memory on the request path, batched compare-and-set merges into the store,
reads that see both, and a stop that loses nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from llmgwd.accounting.usage import USAGE, Counts, Usage
from llmgwd.store import Compare, Delete, Get, Put, TxnResult, prefix_end
from llmgwd.store.sqlite import SqliteStore

DAY = "2025-03-04"


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(":memory:")
    yield s
    await s.close()


async def stored(store: SqliteStore) -> dict[str, Counts]:
    kvs, _ = await store.range(USAGE, prefix_end(USAGE))
    return {kv.key: msgspec.json.decode(kv.value, type=Counts) for kv in kvs}


async def test_adds_touch_only_memory_until_a_flush(store: SqliteStore) -> None:
    usage = Usage(store)
    before = await store.revision()
    for _ in range(3):
        usage.add((DAY, "k1", "smol"), 10, 5, 7)
    usage.add((DAY, "k2", "org/model"), 1, 1, 0)
    assert await store.revision() == before
    assert await usage.flush() == 2
    assert await stored(store) == {
        f"/usage/{DAY}/k1/smol": Counts(
            requests=3, prompt_tokens=30, completion_tokens=15, spend_pico=21
        ),
        f"/usage/{DAY}/k2/org/model": Counts(requests=1, prompt_tokens=1, completion_tokens=1),
    }
    assert await usage.flush() == 0  # nothing new: no write
    assert await store.revision() == before + 1


async def test_a_flush_writes_in_batches(store: SqliteStore) -> None:
    usage = Usage(store)
    for i in range(100):
        usage.add((DAY, f"k{i:03}", "smol"), 1, 1, 0)
    before = await store.revision()
    assert await usage.flush() == 100
    assert await store.revision() == before + 2  # two transactions of at most 64 rows
    assert len(await stored(store)) == 100


async def test_flushes_merge_with_what_is_stored(store: SqliteStore) -> None:
    one, other = Usage(store), Usage(store)  # two control planes, one store
    one.add((DAY, "k", "smol"), 10, 1, 100)
    other.add((DAY, "k", "smol"), 20, 2, 200)
    await asyncio.gather(one.flush(), other.flush())
    one.add((DAY, "k", "smol"), 1, 1, 1)
    await one.flush()
    assert await stored(store) == {
        f"/usage/{DAY}/k/smol": Counts(
            requests=3, prompt_tokens=31, completion_tokens=4, spend_pico=301
        )
    }


async def test_records_add_the_store_and_memory_once(store: SqliteStore) -> None:
    usage = Usage(store)
    usage.add((DAY, "k", "smol"), 10, 1, 0)
    usage.add(("2025-03-01", "k", "smol"), 99, 9, 0)
    await usage.flush()
    usage.add((DAY, "k", "smol"), 5, 1, 0)  # not flushed yet
    [record] = await usage.records(DAY)
    assert (record.day, record.key_id, record.model) == (DAY, "k", "smol")
    assert (record.counts.requests, record.counts.prompt_tokens) == (2, 15)
    assert len(await usage.records("2025-03-01")) == 2


class FailingOnce:
    """A store whose next transaction fails, as a store that went away would."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.fail = True

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def txn(
        self,
        compare: list[Compare],
        success: list[Put | Delete | Get],
        failure: list[Put | Delete | Get] | None = None,
    ) -> TxnResult:
        if self.fail:
            self.fail = False
            raise ConnectionError("store unreachable")
        return await self.store.txn(compare, success, failure)


async def test_a_failed_flush_keeps_the_counts_for_the_next(store: SqliteStore) -> None:
    usage = Usage(FailingOnce(store))  # type: ignore[arg-type]
    usage.add((DAY, "k", "smol"), 10, 1, 0)
    with pytest.raises(ConnectionError):
        await usage.flush()
    usage.add((DAY, "k", "smol"), 10, 1, 0)
    assert await usage.flush() == 1
    assert (await stored(store))[f"/usage/{DAY}/k/smol"].requests == 2


async def test_the_flusher_writes_in_the_background_and_everything_on_stop(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    store = await SqliteStore.open(path)
    usage = Usage(store, interval_s=0.01)
    usage.start()
    usage.add((DAY, "k", "smol"), 1, 1, 0)
    for _ in range(500):  # the background flush takes it
        if not usage.pending():
            break
        await asyncio.sleep(0.01)
    assert not usage.pending()
    usage.add((DAY, "k", "big"), 2, 2, 0)
    await usage.stop()
    await store.close()
    store = await SqliteStore.open(path)
    try:
        assert {k.rsplit("/", 1)[1]: c.requests for k, c in (await stored(store)).items()} == {
            "smol": 1,
            "big": 1,
        }
    finally:
        await store.close()


async def test_stop_without_start_flushes_too(store: SqliteStore) -> None:
    usage = Usage(store, interval_s=3600)
    usage.add((DAY, "k", "smol"), 1, 1, 0)
    await usage.stop()
    assert len(await stored(store)) == 1


class HeldTxn:
    """A store whose transactions wait until the test lets them through."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def txn(
        self,
        compare: list[Compare],
        success: list[Put | Delete | Get],
        failure: list[Put | Delete | Get] | None = None,
    ) -> TxnResult:
        self.entered.set()
        await self.release.wait()
        return await self.store.txn(compare, success, failure)


async def test_stop_during_a_flush_writes_what_came_meanwhile(store: SqliteStore) -> None:
    held = HeldTxn(store)
    usage = Usage(held, interval_s=0.001)  # type: ignore[arg-type]
    usage.start()
    usage.add((DAY, "k", "smol"), 1, 1, 0)
    await held.entered.wait()  # a flush is writing
    usage.add((DAY, "k", "big"), 1, 1, 0)
    stopping = asyncio.create_task(usage.stop())
    await asyncio.sleep(0)
    held.release.set()
    await stopping
    assert sorted(k.rsplit("/", 1)[1] for k in await stored(store)) == ["big", "smol"]
