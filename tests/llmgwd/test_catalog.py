"""The catalog: models, keys and join tokens kept in the store, read from memory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from llmgwd.catalog import Catalog, CatalogError, KeyOwner, Model
from llmgwd.people.directory import Directory
from llmgwd.store.sqlite import SqliteStore


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(":memory:")
    yield s
    await s.close()


async def test_models_and_keys_survive_a_new_catalog_on_the_same_store(store: SqliteStore) -> None:
    cat = Catalog(store)
    await cat.load()
    await cat.add_model(Model(name="m", source="file:/m.gguf"))
    await cat.update_model("m", replicas=2)
    key, secret = await cat.create_key("alice")
    again = Catalog(store)
    await again.load()
    assert [(m.name, m.replicas) for m in again.all()] == [("m", 2)]
    found = again.authenticate(secret)
    assert found is not None and found.id == key.id
    assert secret not in repr(again.keys())  # only the hash is kept


async def test_a_duplicate_model_is_refused(store: SqliteStore) -> None:
    cat = Catalog(store)
    await cat.add_model(Model(name="m", source="file:/m.gguf"))
    with pytest.raises(CatalogError, match="already exists"):
        await cat.add_model(Model(name="m", source="file:/other.gguf"))


async def test_a_revoked_or_wrong_key_does_not_authenticate(store: SqliteStore) -> None:
    cat = Catalog(store)
    key, secret = await cat.create_key("bob")
    assert cat.authenticate(secret[:-1] + ("A" if secret[-1] != "A" else "B")) is None
    assert cat.authenticate("not-a-key") is None
    await cat.revoke_key(key.id)
    assert cat.authenticate(secret) is None


async def test_revoke_takes_an_id_never_a_name(store: SqliteStore) -> None:
    cat = Catalog(store)
    key, secret = await cat.create_key("bob")
    other, _ = await cat.create_key(key.id)  # a name like an id (from before names were checked)
    with pytest.raises(CatalogError, match="no key"):
        await cat.revoke_key("bob")
    assert (await cat.revoke_key(key.id)).id == key.id  # one match, not the other key too
    assert cat.authenticate(secret) is None
    keys = cat.keys()
    assert [k.revoked for k in keys] == [True, False] and keys[1].id == other.id


async def test_a_join_token_works_once(store: SqliteStore) -> None:
    cat = Catalog(store)
    await cat.add_token("tok.secret", ttl_s=60)
    assert await cat.consume_token("tok.secret")
    assert not await cat.consume_token("tok.secret")
    assert not await cat.consume_token("never.issued")


async def test_an_expired_token_is_refused(store: SqliteStore) -> None:
    cat = Catalog(store)
    await cat.add_token("old.secret", ttl_s=0.2)
    await asyncio.sleep(0.4)
    assert not await cat.consume_token("old.secret")


async def test_follow_applies_changes_made_by_another_writer(store: SqliteStore) -> None:
    reader, writer = Catalog(store), Catalog(store)
    rev = await reader.load()
    changed = asyncio.Event()
    reader.on_change(changed.set)
    task = asyncio.create_task(reader.follow(rev))
    try:
        await writer.add_model(Model(name="late", source="file:/l.gguf"))
        await asyncio.wait_for(changed.wait(), 5)
        assert reader.get("late") is not None
        changed.clear()
        await writer.remove_model("late")
        await asyncio.wait_for(changed.wait(), 5)
        assert reader.get("late") is None
    finally:
        task.cancel()


async def test_follow_reads_everything_again_after_its_watch_was_compacted() -> None:
    """A control plane whose watch fell behind the store's compaction (etcd's
    auto-compaction, a watch cut for minutes) reads the catalog again and goes on following:
    a key revoked meanwhile stops authenticating there, and later changes still arrive."""
    store = await SqliteStore.open(":memory:", keep_revisions=10)
    try:
        reader, writer = Catalog(store), Catalog(store)
        key, secret = await writer.create_key("bob")
        rev = await reader.load()
        await writer.revoke_key(key.id)
        for i in range(40):  # other writes: the history from rev on is compacted away
            await store.put(f"/usage/x/{i}", b"{}")
        changed = asyncio.Event()
        reader.on_change(changed.set)
        task = asyncio.create_task(reader.follow(rev))
        try:
            await asyncio.wait_for(changed.wait(), 5)
            assert reader.authenticate(secret) is None
            changed.clear()
            await writer.add_model(Model(name="later", source="file:/l.gguf"))
            await asyncio.wait_for(changed.wait(), 5)
            assert reader.get("later") is not None
        finally:
            task.cancel()
    finally:
        await store.close()


async def test_a_waiting_users_key_stays_refused_across_a_reload(store: SqliteStore) -> None:
    people = Directory(store)
    wes = await people.create_user("wes", source="oidc", approved=False)  # waiting
    ann = await people.create_user("ann", source="oidc")
    cat = Catalog(store)
    await cat.load()
    _, waiting = await cat.create_key("w", owner=KeyOwner(user=wes.id))
    _, working = await cat.create_key("a", owner=KeyOwner(user=ann.id))
    assert cat.authenticate(waiting) is None and cat.authenticate(working) is not None
    again = Catalog(store)  # a restart, or another control plane
    await again.load()
    assert again.authenticate(waiting) is None  # still waiting for staff's approval
    assert again.authenticate(working) is not None
    await people.change_user(wes.id, approved=True)
    once_approved = Catalog(store)
    await once_approved.load()
    assert once_approved.authenticate(waiting) is not None
