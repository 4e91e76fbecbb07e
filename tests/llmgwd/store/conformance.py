"""The store conformance suite: what every backend (SQLite, etcd) must do, as etcd v3 does it.

A backend's test module subclasses StoreConformance (under a name starting with Test) and
defines a `store` fixture yielding a fresh, empty, open Store, closing it afterwards (closing
twice must be harmless: one test closes it itself). A backend with a minimum lease TTL raises
lease_ttl_s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Literal

import pytest

from llmgwd.store.base import KV, Compare, Delete, Event, Get, Put, Store, prefix_end

CompareOp = Literal["=", "!=", "<", ">"]
WAIT_S = 5.0  # the longest any test waits for an event that must come


async def take(events: AsyncIterator[Event], n: int) -> list[Event]:
    """The next n events, failing if they do not come within WAIT_S."""
    async with asyncio.timeout(WAIT_S):
        return [await anext(events) for _ in range(n)]


def summary(events: list[Event]) -> list[tuple[str, str, bytes, int]]:
    """(type, key, value, mod_revision) of each event: what most assertions compare."""
    return [(e.type, e.kv.key, e.kv.value, e.kv.mod_revision) for e in events]


def keys(kvs: list[KV]) -> list[str]:
    """The keys of a range's result."""
    return [kv.key for kv in kvs]


class StoreConformance:
    """Every test takes the backend's `store` fixture."""

    lease_ttl_s = 0.3

    # --- get, put, delete, revisions ---

    async def test_put_then_get_returns_the_value_and_its_revisions(self, store: Store) -> None:
        rev = await store.put("a", b"1")
        assert await store.get("a") == KV("a", b"1", rev, rev, 1)

    async def test_get_of_a_missing_key_is_none(self, store: Store) -> None:
        assert await store.get("nope") is None

    async def test_rewriting_a_key_keeps_create_and_counts_version(self, store: Store) -> None:
        first = await store.put("a", b"1")
        second = await store.put("a", b"2")
        assert await store.get("a") == KV("a", b"2", first, second, 2)

    async def test_recreated_key_starts_a_new_version_history(self, store: Store) -> None:
        await store.put("a", b"1")
        await store.put("a", b"2")
        await store.delete("a")
        rev = await store.put("a", b"3")
        assert await store.get("a") == KV("a", b"3", rev, rev, 1)

    async def test_each_write_makes_exactly_one_revision(self, store: Store) -> None:
        start = await store.revision()
        assert await store.put("a", b"1") == start + 1
        assert await store.delete("a") == (1, start + 2)
        assert await store.delete("a") == (0, start + 2)  # deleted nothing: no revision
        both = await store.txn([], [Put("b", b"1"), Put("c", b"1")])
        assert both.revision == start + 3
        assert (await store.txn([], [Get("b")])).revision == start + 3
        assert await store.revision() == start + 3

    async def test_concurrent_writes_get_distinct_consecutive_revisions(self, store: Store) -> None:
        start = await store.revision()
        revs = await asyncio.gather(*(store.put(f"k{i}", b"x") for i in range(20)))
        assert sorted(revs) == list(range(start + 1, start + 21))
        assert await store.revision() == start + 20

    async def test_delete_of_a_range_removes_only_that_range(self, store: Store) -> None:
        for key in ("a", "a/1", "a/2", "a0", "b"):
            await store.put(key, b"x")
        count, rev = await store.delete("a/", prefix_end("a/"))
        assert count == 2
        assert rev == await store.revision()
        assert keys((await store.range("", prefix_end("")))[0]) == ["a", "a0", "b"]

    # --- range ---

    async def test_range_is_in_byte_order_of_the_key(self, store: Store) -> None:
        names = ["b", "a", "ab", "a/z", "é", "Z", "a b", "\u4e2d"]
        for key in names:
            await store.put(key, b"x")
        kvs, rev = await store.range("", prefix_end(""))
        assert keys(kvs) == sorted(names, key=str.encode)
        assert rev == await store.revision()

    async def test_range_of_one_key_does_not_match_longer_keys(self, store: Store) -> None:
        await store.put("a", b"1")
        await store.put("ab", b"2")
        kvs, _ = await store.range("a")
        assert keys(kvs) == ["a"]

    async def test_range_limit_returns_the_first_keys(self, store: Store) -> None:
        for key in ("d", "c", "b", "a"):
            await store.put(key, b"x")
        kvs, _ = await store.range("a", "z", limit=2)
        assert keys(kvs) == ["a", "b"]
        assert len((await store.range("a", "z", limit=0))[0]) == 4

    async def test_prefix_range_holds_exactly_the_prefixed_keys(self, store: Store) -> None:
        assert prefix_end("a/") == "a0"
        assert prefix_end("") == "\0"
        for key in ("a", "a/", "a/x", "a/y/z", "a0", "b"):
            await store.put(key, b"x")
        kvs, _ = await store.range("a/", prefix_end("a/"))
        assert keys(kvs) == ["a/", "a/x", "a/y/z"]

    async def test_range_at_an_older_revision_reads_history(self, store: Store) -> None:
        r1 = await store.put("a", b"1")
        r2 = await store.put("a", b"2")
        r3 = await store.put("b", b"1")
        _, r4 = await store.delete("a")
        r5 = await store.put("c", b"1")
        at = {}
        for rev in (r1, r2, r3, r4):
            kvs, current = await store.range("", prefix_end(""), revision=rev)
            assert current == r5
            at[rev] = kvs
        assert at[r1] == [KV("a", b"1", r1, r1, 1)]
        assert at[r2] == [KV("a", b"2", r1, r2, 2)]
        assert at[r3] == [KV("a", b"2", r1, r2, 2), KV("b", b"1", r3, r3, 1)]
        assert at[r4] == [KV("b", b"1", r3, r3, 1)]
        assert keys((await store.range("a", "z", limit=1, revision=r3))[0]) == ["a"]

    async def test_range_at_a_future_revision_is_refused(self, store: Store) -> None:
        rev = await store.put("a", b"1")
        with pytest.raises(ValueError):
            await store.range("a", revision=rev + 1)

    # --- txn ---

    async def test_compare_on_a_missing_key_sees_zeros(self, store: Store) -> None:
        create: list[Put | Delete | Get] = [Put("lock", b"me")]
        missing = Compare("lock", "version", "=", 0)
        assert (await store.txn([missing], create)).succeeded
        assert not (await store.txn([missing], create)).succeeded
        assert (await store.txn([Compare("new", "create", "=", 0)], [])).succeeded
        assert (await store.txn([Compare("new", "mod", "<", 1)], [])).succeeded

    async def test_value_compare_on_a_missing_key_never_holds(self, store: Store) -> None:
        ops: tuple[CompareOp, ...] = ("=", "!=", "<", ">")
        for op in ops:
            result = await store.txn([Compare("nope", "value", op, b"")], [])
            assert not result.succeeded, op

    async def test_failed_compare_runs_the_failure_branch(self, store: Store) -> None:
        await store.put("k", b"old")
        result = await store.txn(
            [Compare("k", "value", "=", b"other")],
            [Put("k", b"success")],
            [Put("k", b"failure"), Get("k")],
        )
        assert not result.succeeded
        assert [kv.value for kv in result.responses[0]] == [b"failure"]
        assert (await store.get("k")) == result.responses[0][0]

    async def test_failed_compare_without_failure_branch_changes_nothing(
        self, store: Store
    ) -> None:
        rev = await store.put("k", b"old")
        result = await store.txn([Compare("k", "version", ">", 1)], [Put("k", b"new")])
        assert not result.succeeded
        assert result.revision == rev
        assert result.responses == []
        assert (await store.get("k")) == KV("k", b"old", rev, rev, 1)

    async def test_every_compare_must_hold(self, store: Store) -> None:
        rev = await store.put("k", b"v")
        holds = [
            Compare("k", "value", "=", b"v"),
            Compare("k", "value", "!=", b"w"),
            Compare("k", "value", "<", b"w"),
            Compare("k", "value", ">", b"u"),
            Compare("k", "mod", "=", rev),
            Compare("k", "create", "<", rev + 1),
            Compare("k", "version", ">", 0),
        ]
        assert (await store.txn(holds, [])).succeeded
        broken = Compare("k", "version", "!=", 1)
        assert not (await store.txn([*holds, broken], [])).succeeded

    async def test_txn_gets_return_results_in_order_and_see_earlier_writes(
        self, store: Store
    ) -> None:
        await store.put("p/1", b"1")
        result = await store.txn(
            [], [Get("p/1"), Put("p/2", b"2"), Get("p/", prefix_end("p/")), Get("missing")]
        )
        assert result.succeeded
        first, both, missing = result.responses
        assert keys(first) == ["p/1"]
        assert keys(both) == ["p/1", "p/2"]
        assert both[1].mod_revision == result.revision
        assert missing == []

    async def test_txn_writes_share_one_revision(self, store: Store) -> None:
        await store.put("gone", b"x")
        result = await store.txn([], [Put("a", b"1"), Put("b", b"1"), Delete("gone")])
        kvs, rev = await store.range("a", "c")
        assert rev == result.revision
        assert [kv.mod_revision for kv in kvs] == [rev, rev]
        assert await store.get("gone") is None

    async def test_txn_delete_of_a_range(self, store: Store) -> None:
        for key in ("q/1", "q/2", "r"):
            await store.put(key, b"x")
        await store.txn([Compare("r", "version", "=", 1)], [Delete("q/", prefix_end("q/"))])
        assert keys((await store.range("", prefix_end("")))[0]) == ["r"]

    async def test_only_one_of_concurrent_compare_and_sets_wins(self, store: Store) -> None:
        await store.put("counter", b"0")
        seen = await store.get("counter")
        assert seen is not None

        async def increment(i: int) -> bool:
            assert seen is not None
            held = Compare("counter", "version", "=", seen.version)
            result = await store.txn([held], [Put("counter", f"1 by {i}".encode())])
            return result.succeeded

        before = await store.revision()
        wins = await asyncio.gather(*(increment(i) for i in range(20)))
        assert wins.count(True) == 1
        now = await store.get("counter")
        assert now is not None
        assert now.value == f"1 by {wins.index(True)}".encode()
        assert now.version == seen.version + 1
        assert await store.revision() == before + 1

    # --- watch ---

    async def test_watch_from_now_sees_later_writes_only(self, store: Store) -> None:
        await store.put("w", b"before")
        events = store.watch("w")
        first = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.05)  # lets a backend that registers watches lazily register it
        rev = await store.put("w", b"after")
        async with asyncio.timeout(WAIT_S):
            event = await first
        assert summary([event]) == [("put", "w", b"after", rev)]
        assert event.prev_kv is not None
        assert event.prev_kv.value == b"before"

    async def test_watch_reports_puts_and_deletes_with_prev_kv(self, store: Store) -> None:
        start = await store.revision()
        events = store.watch("k", start_revision=start + 1)
        r1 = await store.put("k", b"1")
        _, r2 = await store.delete("k")
        put, delete = await take(events, 2)
        assert put == Event("put", KV("k", b"1", r1, r1, 1), None)
        assert delete.type == "delete"
        assert (delete.kv.key, delete.kv.value, delete.kv.mod_revision) == ("k", b"", r2)
        assert delete.prev_kv == KV("k", b"1", r1, r1, 1)

    async def test_watch_from_an_old_revision_replays_then_follows(self, store: Store) -> None:
        r1 = await store.put("a", b"1")
        r2 = await store.put("a", b"2")
        _, r3 = await store.delete("a")
        events = store.watch("a", start_revision=r1)
        replayed = await take(events, 3)
        assert summary(replayed) == [
            ("put", "a", b"1", r1),
            ("put", "a", b"2", r2),
            ("delete", "a", b"", r3),
        ]
        assert replayed[1].prev_kv == KV("a", b"1", r1, r1, 1)
        assert replayed[2].prev_kv == KV("a", b"2", r1, r2, 2)
        r4 = await store.put("a", b"3")
        live = await take(events, 1)
        assert summary(live) == [("put", "a", b"3", r4)]
        assert live[0].prev_kv is None  # recreated after a delete

    async def test_watch_of_a_prefix_sees_only_that_prefix(self, store: Store) -> None:
        start = await store.revision()
        events = store.watch("m/", prefix_end("m/"), start_revision=start + 1)
        await store.put("m", b"no")
        await store.put("m0", b"no")
        r1 = await store.put("m/1", b"yes")
        await store.put("n/1", b"no")
        r2 = await store.put("m/2/x", b"yes")
        assert summary(await take(events, 2)) == [
            ("put", "m/1", b"yes", r1),
            ("put", "m/2/x", b"yes", r2),
        ]

    async def test_watch_of_one_key_ignores_longer_keys(self, store: Store) -> None:
        start = await store.revision()
        events = store.watch("k", start_revision=start + 1)
        await store.put("kk", b"no")
        rev = await store.put("k", b"yes")
        assert summary(await take(events, 1)) == [("put", "k", b"yes", rev)]

    async def test_watch_sees_a_txn_as_events_sharing_a_revision(self, store: Store) -> None:
        await store.put("t/old", b"x")
        start = await store.revision()
        events = store.watch("t/", prefix_end("t/"), start_revision=start + 1)
        result = await store.txn([], [Put("t/b", b"1"), Put("t/a", b"1"), Delete("t/old")])
        rev = result.revision
        assert summary(await take(events, 3)) == [
            ("put", "t/b", b"1", rev),
            ("put", "t/a", b"1", rev),
            ("delete", "t/old", b"", rev),
        ]

    async def test_watch_ends_when_the_store_closes(self, store: Store) -> None:
        seen: list[Event] = []
        got_one = asyncio.Event()
        start = await store.revision()

        async def follow() -> None:
            async for event in store.watch("c", start_revision=start + 1):
                seen.append(event)
                got_one.set()

        follower = asyncio.create_task(follow())
        await store.put("c", b"1")
        async with asyncio.timeout(WAIT_S):
            await got_one.wait()
        await store.close()
        async with asyncio.timeout(WAIT_S):
            await follower  # ends without an error
        assert summary(seen)[0][:3] == ("put", "c", b"1")

    # --- leases ---

    async def test_keys_of_a_revoked_lease_are_deleted(self, store: Store) -> None:
        lease = await store.lease_grant(30)
        await store.put("l/1", b"x", lease=lease)
        await store.put("l/2", b"x", lease=lease)
        await store.put("l/3", b"x")
        kv = await store.get("l/1")
        assert kv is not None
        assert kv.lease == lease
        start = await store.revision()
        events = store.watch("l/", prefix_end("l/"), start_revision=start + 1)
        await store.lease_revoke(lease)
        deleted = await take(events, 2)
        assert [(e.type, e.kv.key) for e in deleted] == [("delete", "l/1"), ("delete", "l/2")]
        assert keys((await store.range("l/", prefix_end("l/")))[0]) == ["l/3"]
        with pytest.raises(KeyError):
            await store.lease_keepalive(lease)

    async def test_keys_of_an_expired_lease_are_deleted_with_events(self, store: Store) -> None:
        lease = await store.lease_grant(self.lease_ttl_s)
        await store.put("e/1", b"x", lease=lease)
        await store.put("e/2", b"x", lease=lease)
        await store.put("e/3", b"x")
        start = await store.revision()
        events = store.watch("e/", prefix_end("e/"), start_revision=start + 1)
        deleted = await take(events, 2)
        assert [(e.type, e.kv.key) for e in deleted] == [("delete", "e/1"), ("delete", "e/2")]
        assert [e.prev_kv.value if e.prev_kv else None for e in deleted] == [b"x", b"x"]
        assert keys((await store.range("e/", prefix_end("e/")))[0]) == ["e/3"]
        with pytest.raises(KeyError):
            await store.lease_keepalive(lease)

    async def test_keepalive_keeps_a_lease_past_its_ttl(self, store: Store) -> None:
        lease = await store.lease_grant(self.lease_ttl_s)
        await store.put("alive", b"x", lease=lease)
        loop = asyncio.get_running_loop()
        until = loop.time() + 2.5 * self.lease_ttl_s
        while loop.time() < until:
            assert await store.lease_keepalive(lease) == pytest.approx(self.lease_ttl_s)
            await asyncio.sleep(self.lease_ttl_s / 4)
        assert await store.get("alive") is not None

    async def test_keepalive_or_revoke_of_an_unknown_lease_raises(self, store: Store) -> None:
        with pytest.raises(KeyError):
            await store.lease_keepalive(123456789)
        with pytest.raises(KeyError):
            await store.lease_revoke(123456789)

    async def test_put_with_an_unknown_lease_is_refused(self, store: Store) -> None:
        before = await store.revision()
        with pytest.raises(KeyError):
            await store.put("k", b"x", lease=123456789)
        assert await store.get("k") is None
        assert await store.revision() == before

    async def test_a_txn_refused_midway_applies_nothing(self, store: Store) -> None:
        before = await store.revision()
        with pytest.raises(KeyError):
            await store.txn([], [Put("first", b"x"), Put("second", b"x", lease=123456789)])
        assert await store.get("first") is None
        assert await store.revision() == before

    async def test_rewriting_a_key_without_its_lease_detaches_it(self, store: Store) -> None:
        lease = await store.lease_grant(30)
        await store.put("d", b"leased", lease=lease)
        await store.put("d", b"free")
        await store.lease_revoke(lease)
        kv = await store.get("d")
        assert kv is not None
        assert (kv.value, kv.lease) == (b"free", 0)
