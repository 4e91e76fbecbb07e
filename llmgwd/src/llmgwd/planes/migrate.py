"""Copying every key of one store into another, empty one (`llmgw plane migrate --to etcd`),
in key order, in batches by transaction, then reading every key back to check it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from llmgwd.store import KV, Compare, Put, Store, prefix_end

BATCH_KEYS = 64  # etcd refuses a txn of more than 128 operations (--max-txn-ops)
BATCH_BYTES = 512 << 10  # and a request over 1.5 MiB (--max-request-bytes)
PAGE = 500  # keys read from a store at once
ALL = prefix_end("")


class MigrateError(Exception):
    """The copy cannot be made or did not check; the message names a key, never a value."""


@dataclass(slots=True)
class Copied:
    """What a copy did: keys and bytes written, and the leased keys left behind.

    A key held by a lease (a join token, a control plane's liveness record) lives only as
    long as its lease, which the target store cannot take over: it is not copied.
    """

    keys: int = 0
    bytes: int = 0
    leased: list[str] = field(default_factory=list)
    revision: int = 0  # the source's revision that was copied


async def pages(store: Store, revision: int) -> AsyncIterator[KV]:
    """Every key of store at revision, in key order, PAGE at a time."""
    start = ""
    while True:
        kvs, _ = await store.range(start, ALL, limit=PAGE, revision=revision)
        for kv in kvs:
            yield kv
        if len(kvs) < PAGE:
            return
        start = kvs[-1].key + "\0"


async def _write(target: Store, batch: list[KV]) -> None:
    """One batch in one transaction, each key required absent from the target."""
    if not batch:
        return
    absent = [Compare(kv.key, "version", "=", 0) for kv in batch]
    res = await target.txn(absent, [Put(kv.key, kv.value) for kv in batch])
    if not res.succeeded:
        raise MigrateError(
            f"a key between {batch[0].key!r} and {batch[-1].key!r} appeared in the target "
            "store during the copy: something else writes to it"
        )


async def copy(
    source: Store, target: Store, *, batch_keys: int = BATCH_KEYS, batch_bytes: int = BATCH_BYTES
) -> Copied:
    """Copy every unleased key of source (at its revision now) into the empty target."""
    existing, _ = await target.range("", ALL, limit=1)
    if existing:
        raise MigrateError(
            f"the target store is not empty (it holds {existing[0].key!r}): "
            "a migration was made into it before"
        )
    done = Copied(revision=await source.revision())
    batch: list[KV] = []
    size = 0
    async for kv in pages(source, done.revision):
        if kv.lease:
            done.leased.append(kv.key)
            continue
        if batch and (len(batch) >= batch_keys or size + len(kv.value) > batch_bytes):
            await _write(target, batch)
            batch, size = [], 0
        batch.append(kv)
        size += len(kv.key) + len(kv.value)
        done.keys += 1
        done.bytes += len(kv.value)
    await _write(target, batch)
    await verify(source, target, done)
    return done


async def verify(source: Store, target: Store, done: Copied) -> None:
    """Read both stores back in key order: the same keys with the same values, no more."""
    leased = set(done.leased)
    want = (kv async for kv in pages(source, done.revision) if kv.key not in leased)
    count = 0
    async for got in pages(target, 0):
        kv = await anext(want, None)
        if kv is not None and kv.key < got.key:
            raise MigrateError(f"{kv.key!r} is missing from the target")
        if kv is None or kv.key != got.key:
            raise MigrateError(f"the target holds {got.key!r}, which the source does not")
        if kv.value != got.value:
            raise MigrateError(f"the value of {got.key!r} differs in the target")
        count += 1
    missing = await anext(want, None)
    if missing is not None:
        raise MigrateError(f"{missing.key!r} is missing from the target")
    if count != done.keys:
        raise MigrateError(f"the target holds {count} keys, not the {done.keys} copied")
