"""Copying a whole store into an empty one (the core of `llmgw plane migrate --to etcd`):
models, keys, usage, placements and mirror records all there after, checked key by key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgwd.catalog import Catalog, Model
from llmgwd.planes import migrate
from llmgwd.store import Put, Store, prefix_end
from llmgwd.store.sqlite import SqliteStore

ALL = prefix_end("")


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[Store, Store]]:
    source = await SqliteStore.open(tmp_path / "state.db")
    target = await SqliteStore.open(tmp_path / "target.db")
    yield source, target
    await source.close()
    await target.close()


async def _cluster(store: Store) -> tuple[Catalog, str]:
    """A cluster's worth of state: a model, keys, usage, a placement, a mirror record."""
    catalog = Catalog(store)
    await catalog.load()
    await catalog.add_model(Model(name="smol", source="file:/m.gguf", replicas=2))
    _, secret = await catalog.create_key("alice", "admin")
    await catalog.create_key("bob")
    await store.put("/usage/2026-12-03/abc/smol", b'{"requests":3}')
    await store.put("/placements/smol", b'[{"node":"n1"}]')
    await store.put("/mirror/snapshots/acme--tiny/" + "0" * 40, b"\x00\xffbinary")
    return catalog, secret


async def _everything(store: Store) -> dict[str, bytes]:
    kvs, _ = await store.range("", ALL)
    return {kv.key: kv.value for kv in kvs}


async def test_every_key_is_copied_and_the_catalog_reads_the_same(
    stores: tuple[Store, Store],
) -> None:
    source, target = stores
    catalog, secret = await _cluster(source)
    before = await _everything(source)
    done = await migrate.copy(source, target)
    assert done.keys == len(before) and done.leased == []
    assert await _everything(target) == before
    again = Catalog(target)
    await again.load()
    assert [m.name for m in again.all()] == ["smol"]
    assert again.authenticate(secret) == catalog.authenticate(secret) is not None
    assert [k.name for k in again.keys()] == [k.name for k in catalog.keys()]  # noqa: SIM118


async def test_many_keys_in_small_batches_and_pages(stores: tuple[Store, Store]) -> None:
    source, target = stores
    for i in range(0, 1200, 100):  # 1200 keys in 12 transactions
        await source.txn([], [Put(f"/k/{j:05d}", str(j).encode()) for j in range(i, i + 100)])
    done = await migrate.copy(source, target, batch_keys=7, batch_bytes=40)
    assert done.keys == 1200
    assert await _everything(target) == await _everything(source)


async def test_leased_keys_are_left_behind_and_said(stores: tuple[Store, Store]) -> None:
    source, target = stores
    await source.put("/models/a", b"{}")
    lease = await source.lease_grant(60)
    await source.put("/tokens/deadbeef", b"{}", lease=lease)
    done = await migrate.copy(source, target)
    assert done.leased == ["/tokens/deadbeef"]
    assert set(await _everything(target)) == {"/models/a"}


async def test_a_second_copy_into_the_same_target_is_refused(stores: tuple[Store, Store]) -> None:
    source, target = stores
    await _cluster(source)
    await migrate.copy(source, target)
    with pytest.raises(migrate.MigrateError, match="not empty"):
        await migrate.copy(source, target)


async def test_a_value_changed_in_the_target_fails_the_check(stores: tuple[Store, Store]) -> None:
    source, target = stores
    await _cluster(source)
    done = await migrate.copy(source, target)
    await target.put("/models/smol", b"changed")
    with pytest.raises(migrate.MigrateError, match="'/models/smol' differs"):
        await migrate.verify(source, target, done)
    await target.delete("/models/smol")
    with pytest.raises(migrate.MigrateError, match="'/models/smol' is missing"):
        await migrate.verify(source, target, done)
    kv = await source.get("/models/smol")
    assert kv is not None
    await target.put("/models/smol", kv.value)
    await target.put("/zzz", b"extra")
    with pytest.raises(migrate.MigrateError, match="'/zzz', which the source does not"):
        await migrate.verify(source, target, done)
