"""The store's schema version at /schema: recorded by the first llmgwd, checked by every llmgwd
as it opens the store, raised only once every joined control plane writes the newer one."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from llmgw import compat, package_version
from llmgw.config import ConfigError
from llmgwd.store.base import Compare, Put, Store

# What this llmgwd writes, and the oldest it reads: a release that changes what it writes
# raises SCHEMA and sets OLDEST_SCHEMA to the SCHEMA of the release before (llmgw.compat).
SCHEMA = 1
OLDEST_SCHEMA = 1
KEY = "/schema"


class Record(msgspec.Struct, frozen=True):
    """/schema's value: the schema the store's data is in, and the llmgwd that set it."""

    schema: int
    llmgwd: str = ""


class SchemaRefused(ConfigError):
    """This llmgwd cannot run on this store; the message names both versions. A ConfigError:
    llmgwd exits 78 saying it in one line, which its unit does not restart."""


_dec = msgspec.json.Decoder(Record)


async def stored(store: Store) -> tuple[Record, int] | None:
    """/schema's record and its mod revision; None when no llmgwd recorded one yet."""
    kv = await store.get(KEY)
    if kv is None:
        return None
    try:
        return _dec.decode(kv.value), kv.mod_revision
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise SchemaRefused(f"the store's {KEY} record cannot be read by this llmgwd") from None


async def check(
    store: Store, *, schema: int | None = None, oldest: int | None = None, version: str = ""
) -> Record:
    """The store's schema, recorded as ours if none is; SchemaRefused when this llmgwd (of
    this schema, reading down to oldest; SCHEMA and OLDEST_SCHEMA unless told) cannot run
    on it."""
    schema = SCHEMA if schema is None else schema
    oldest = OLDEST_SCHEMA if oldest is None else oldest
    version = version or package_version()
    found = await stored(store)
    if found is None:
        mine = Record(schema, version)
        done = await store.txn(
            [Compare(KEY, "version", "=", 0)], [Put(KEY, msgspec.json.encode(mine))]
        )
        if done.succeeded:
            return mine
        found = await stored(store)  # another control plane recorded it meanwhile
        assert found is not None
    record = found[0]
    why = compat.schema_refusal(record.schema, record.llmgwd, schema, oldest, version)
    if why:
        raise SchemaRefused(why)
    return record


async def pending(store: Store, *, schema: int | None = None) -> bool:
    """Whether /schema is below schema (SCHEMA unless told): a raise is still to come."""
    found = await stored(store)
    return found is not None and found[0].schema < (SCHEMA if schema is None else schema)


async def raise_to_ours(
    store: Store, planes: Iterable[int | None], *, schema: int | None = None, version: str = ""
) -> bool:
    """Raise /schema to schema (SCHEMA unless told) once every joined control plane writes it
    (planes: the schema each one's live record says it writes, None for one joined but not
    running now, which may come back on the old release); whether it was raised now."""
    schema = SCHEMA if schema is None else schema
    found = await stored(store)
    if found is None or found[0].schema >= schema:
        return False
    if any(p is None or p < schema for p in planes):
        return False
    record = Record(schema, version or package_version())
    done = await store.txn(
        [Compare(KEY, "mod", "=", found[1])], [Put(KEY, msgspec.json.encode(record))]
    )
    return done.succeeded
