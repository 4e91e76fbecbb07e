"""The store's interface, shaped like etcd's: revisioned keys, ranges, txns, watches, leases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol


@dataclass(frozen=True, slots=True)
class KV:
    """One key as stored: etcd's mvccpb.KeyValue."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Event:
    """A change seen by a watch: a put (kv is the new value) or a delete.

    A delete's kv has the key and mod_revision (the delete's revision), an empty value and
    zeros elsewhere, as in etcd; prev_kv is the key's value before the change, if it had one.
    """

    type: Literal["put", "delete"]
    kv: KV
    prev_kv: KV | None = None


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a transaction, as etcd's Compare.

    target: which field of key is compared; for a missing key, version, create and mod are 0
    and value is None (so Compare(key, "version", "=", 0) means "does not exist"); as in
    etcd, a value compare on a missing key never holds, whatever op.
    """

    key: str
    target: Literal["version", "create", "mod", "value"]
    op: Literal["=", "!=", "<", ">"]
    operand: int | bytes


@dataclass(frozen=True, slots=True)
class Put:
    """Set a key (in a transaction)."""

    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete a key, or every key in [key, end) when end is given (in a transaction)."""

    key: str
    end: str | None = None


@dataclass(frozen=True, slots=True)
class Get:
    """Read a key, or the range [key, end) (in a transaction)."""

    key: str
    end: str | None = None


@dataclass(frozen=True, slots=True)
class TxnResult:
    """What a transaction did: whether its compares held, the revision after it, and the
    results of its Get operations (a list of KVs each) in order."""

    succeeded: bool
    revision: int
    responses: list[list[KV]] = field(default_factory=list)


def prefix_end(prefix: str) -> str:
    """The end of the range holding every key that starts with prefix (etcd's WithPrefix)."""
    if not prefix:
        return "\0"  # etcd's "all keys" end
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class CompactedError(Exception):
    """A watch or read asked for a revision older than the store still keeps."""


class StoreUnavailable(Exception):
    """The store cannot answer now (no quorum, its member out of reach, a leader change under
    the request): a write may or may not have been made; asking again later is safe for a
    compare-and-set. Messages name no key or value."""


class Store(Protocol):
    """The one interface every backend (SQLite, etcd) implements and the conformance suite tests.

    Revisions are cluster-wide and only grow; every write (put, delete, successful txn with
    writes) makes exactly one new revision, as in etcd.
    """

    async def get(self, key: str) -> KV | None:
        """The key's current value, or None."""
        ...

    async def range(
        self, key: str, end: str | None = None, *, limit: int = 0, revision: int = 0
    ) -> tuple[list[KV], int]:
        """Keys in [key, end) in key order (just key when end is None), at revision (0: now).

        Key order is the byte order of the keys' UTF-8. end "\\0" means every key >= key, so
        range("", prefix_end("")) is every key. limit 0 means no limit. Returns the KVs and the
        store's current revision. Raises CompactedError for a revision older than the store
        keeps and ValueError for one newer than the current revision.
        """
        ...

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Set a key; returns the new revision. Raises KeyError for an unknown lease."""
        ...

    async def delete(self, key: str, end: str | None = None) -> tuple[int, int]:
        """Delete a key or the range [key, end); returns (count deleted, revision)."""
        ...

    async def txn(
        self,
        compare: list[Compare],
        success: list[Put | Delete | Get],
        failure: list[Put | Delete | Get] | None = None,
    ) -> TxnResult:
        """Atomically: if every compare holds run success, else failure.

        The branch's operations run in order; a Get sees the branch's earlier writes. All the
        writes share one new revision; a branch that writes nothing makes none.
        """
        ...

    def watch(
        self, key: str, end: str | None = None, *, start_revision: int = 0
    ) -> AsyncIterator[Event]:
        """Events on [key, end) from start_revision (0: from now on), in revision order.

        History from start_revision is replayed first, then live events follow. Iterating
        raises CompactedError when start_revision is older than the store keeps; the
        iterator ends when the store is closed.
        """
        ...

    async def revision(self) -> int:
        """The store's current revision."""
        ...

    async def lease_grant(self, ttl_s: float) -> int:
        """A new lease; keys put with it are deleted when it expires or is revoked."""
        ...

    async def lease_keepalive(self, lease: int) -> float:
        """Renew a lease; returns its TTL. Raises KeyError for an unknown or expired lease."""
        ...

    async def lease_revoke(self, lease: int) -> None:
        """End a lease now, deleting its keys. Raises KeyError for an unknown or expired lease."""
        ...

    async def close(self) -> None:
        """Flush and release the backend, ending open watches. Closing twice is harmless."""
        ...
