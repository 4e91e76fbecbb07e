"""The store's schema: recorded by the first llmgwd, a newer (or too old) one refused by an
llmgwd as it opens the store, naming both versions, and raised only once every joined control
plane (running or not) writes the newer one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from llmgw import log, package_version, wire
from llmgw.config import ServerConfig
from llmgwd import main as llmgwd
from llmgwd.planes import registry
from llmgwd.store import schema
from llmgwd.store.open import open_store
from llmgwd.store.sqlite import SqliteStore


async def put_schema(path: Path, record: schema.Record) -> None:
    store = await SqliteStore.open(path)
    try:
        await store.put(schema.KEY, msgspec.json.encode(record))
    finally:
        await store.close()


async def test_a_new_store_records_this_llmgwds_schema(tmp_path: Path) -> None:
    store = await open_store(ServerConfig(), tmp_path)
    try:
        kv = await store.get(schema.KEY)
        assert kv is not None
        assert msgspec.json.decode(kv.value, type=schema.Record) == schema.Record(
            schema.SCHEMA, package_version()
        )
    finally:
        await store.close()
    store = await open_store(ServerConfig(), tmp_path)  # opened again: the same record
    await store.close()


async def test_a_store_written_by_a_newer_schema_is_refused(tmp_path: Path) -> None:
    await put_schema(tmp_path / "state.db", schema.Record(schema.SCHEMA + 1, "9.9.0"))
    with pytest.raises(schema.SchemaRefused) as e:
        await open_store(ServerConfig(), tmp_path)
    said = str(e.value)
    assert f"the store's schema is {schema.SCHEMA + 1} (written by llmgwd 9.9.0)" in said
    assert f"this llmgwd {package_version()} reads (schema {schema.SCHEMA})" in said
    assert "install llmgwd 9.9.0 or newer" in said


def test_llmgwd_on_a_store_of_a_newer_schema_exits_78_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a traceback and exit 1, which Restart=on-failure would turn into a restart loop."""
    asyncio.run(put_schema(tmp_path / "state.db", schema.Record(schema.SCHEMA + 1, "9.9.0")))
    config = tmp_path / "server.yaml"
    config.write_text(f"state_dir: {tmp_path}\nclient:\n  listen: '127.0.0.1:0'\n")
    monkeypatch.setattr(log, "setup", lambda *_: None)  # the records stay with caplog
    with pytest.raises(SystemExit) as e:
        llmgwd.main(["--config", str(config)])
    assert e.value.code == 78
    said = [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records]
    assert said == [
        (
            "ERROR",
            f"llmgwd cannot start: the store's schema is {schema.SCHEMA + 1} (written by llmgwd "
            f"9.9.0), newer than this llmgwd {package_version()} reads (schema {schema.SCHEMA}): "
            "install llmgwd 9.9.0 or newer here",
            None,
        )
    ]


async def test_a_store_older_than_the_release_before_is_refused(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "state.db")
    try:
        await store.put(schema.KEY, msgspec.json.encode(schema.Record(1, "0.1.0")))
        with pytest.raises(schema.SchemaRefused, match=r"older than this llmgwd 0\.3\.0 reads"):
            await schema.check(store, schema=3, oldest=2, version="0.3.0")
        # The release after takes it: one release behind.
        assert (await schema.check(store, schema=2, oldest=1, version="0.2.0")).schema == 1
    finally:
        await store.close()


async def test_the_schema_is_raised_only_once_every_control_plane_writes_it() -> None:
    store = await SqliteStore.open(":memory:")
    try:
        await schema.check(store, schema=1, oldest=1, version="0.1.0")
        # A roll from schema 1 to 2: the old control plane still runs.
        assert not await schema.raise_to_ours(store, [2, 1], schema=2, version="0.2.0")
        assert (await schema.check(store, schema=1, oldest=1, version="0.1.0")).schema == 1
        assert await schema.raise_to_ours(store, [2, 2], schema=2, version="0.2.0")
        with pytest.raises(schema.SchemaRefused, match=r"written by llmgwd 0\.2\.0"):
            await schema.check(store, schema=1, oldest=1, version="0.1.0")
        assert not await schema.raise_to_ours(store, [2, 2], schema=2)  # raised already
    finally:
        await store.close()


async def test_the_last_control_plane_upgraded_raises_the_schema_as_it_announces_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = await SqliteStore.open(":memory:")
    lease = await store.lease_grant(30)
    old = wire.PlaneInfo("old", "https://old:7710", version="0.1.0", schema=1)
    await store.put(registry.SERVERS + "old", msgspec.json.encode(old), lease=lease)
    await schema.check(store, schema=1, oldest=1, version="0.1.0")
    monkeypatch.setattr(schema, "SCHEMA", 2)  # this llmgwd, a release later, writes 2
    members = ["new", "old"]
    announcer = registry.Announcer(
        store, "new", "https://new:7710", lambda: lease, members_of(members)
    )
    task = asyncio.create_task(announcer.run())
    try:
        announcer.renew()
        await wait_for(lambda: store.get(registry.SERVERS + "new"))
        assert (await schema.check(store, schema=2, oldest=1)).schema == 1  # "old" still runs
        upgraded = msgspec.structs.replace(old, version="0.2.0", schema=2)
        await store.put(registry.SERVERS + "old", msgspec.json.encode(upgraded), lease=lease)
        announcer.renew()
        await wait_for(lambda: raised(store))
        record = await schema.check(store, schema=2, oldest=1)
        assert (record.schema, record.llmgwd) == (2, package_version())
    finally:
        task.cancel()
        await store.close()


async def test_a_joined_control_plane_that_is_down_holds_the_schema_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a roll, the last old plane stops for its own upgrade (or is down for maintenance):
    its host may bring the old llmgwd back, so the schema stays until it runs the new one."""
    store = await SqliteStore.open(":memory:")
    lease = await store.lease_grant(30)
    await schema.check(store, schema=1, oldest=1, version="0.1.0")
    monkeypatch.setattr(schema, "SCHEMA", 2)
    monkeypatch.setattr(registry, "RECHECK_S", 0.01)  # tried again while nothing is due
    members = ["new", "old"]  # "old" joined the store, its llmgwd stopped: no live record
    announcer = registry.Announcer(
        store, "new", "https://new:7710", lambda: lease, members_of(members)
    )
    task = asyncio.create_task(announcer.run())
    try:
        announcer.renew()
        await wait_for(lambda: store.get(registry.SERVERS + "new"))
        await asyncio.sleep(0.1)
        # The old llmgwd comes back (its upgrade failed) and still opens the store.
        assert (await schema.check(store, schema=1, oldest=1, version="0.1.0")).schema == 1
        members.remove("old")  # `llmgw plane remove old`: the raise follows on its own
        await wait_for(lambda: raised(store))
    finally:
        task.cancel()
        await store.close()


async def test_members_unknown_for_now_hold_back_the_raise_not_the_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = await SqliteStore.open(":memory:")
    lease = await store.lease_grant(30)
    await schema.check(store, schema=1, oldest=1, version="0.1.0")
    monkeypatch.setattr(schema, "SCHEMA", 2)
    monkeypatch.setattr(registry, "RECHECK_S", 0.01)
    asked: list[str] = []

    async def members() -> list[str]:
        asked.append("members")
        if len(asked) < 3:
            raise ConnectionError("etcd's member list did not answer")
        return ["new"]

    announcer = registry.Announcer(store, "new", "https://new:7710", lambda: lease, members)
    task = asyncio.create_task(announcer.run())
    try:
        announcer.renew()
        await wait_for(lambda: store.get(registry.SERVERS + "new"))
        await wait_for(lambda: raised(store))  # once the members answer
        assert len(asked) == 3
    finally:
        task.cancel()
        await store.close()


def members_of(names: list[str]) -> Callable[[], Awaitable[list[str]]]:
    async def members() -> list[str]:
        return list(names)

    return members


async def raised(store: SqliteStore) -> bool:
    found = await schema.stored(store)
    return found is not None and found[0].schema == 2


async def wait_for(check: Callable[[], Awaitable[object]]) -> None:
    async with asyncio.timeout(5):
        while not await check():  # noqa: ASYNC110 (the announcer has no event to wait on)
            await asyncio.sleep(0.01)
