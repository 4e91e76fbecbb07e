"""The store's interface, shaped like etcd's: revisioned keys, ranges, transactions, watches, leases."""

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
    """A change seen by a watch: a put (kv is the new value) or a delete (kv.value is empty)."""

    type: Literal["put", "delete"]
    kv: KV
    prev_kv: KV | None = None


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a transaction, as etcd's Compare.

    target: which field of key is compared; for a missing key, version, create and mod are 0
    and value is None (so Compare(key, "version", "=", 0) means "does not exist").
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

        Returns the KVs and the store's current revision.
        """
        ...

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Set a key; returns the new revision."""
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
        """Atomically: if every compare holds run success, else failure."""
        ...

    def watch(self, key: str, end: str | None = None, *, start_revision: int = 0) -> AsyncIterator[Event]:
        """Events on [key, end) from start_revision (0: from now on), in revision order.

        Raises CompactedError when start_revision is older than the store keeps.
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
        """End a lease now, deleting its keys."""
        ...

    async def close(self) -> None:
        """Flush and release the backend."""
        ...
