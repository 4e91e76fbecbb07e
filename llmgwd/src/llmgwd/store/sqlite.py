"""SQLite backend of the store: one WAL file with etcd's revisions, history, watches and leases."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from llmgwd.store.base import KV, CompactedError, Compare, Delete, Event, Get, Put, TxnResult

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# Each entry upgrades the schema from its index to index + 1 (PRAGMA user_version).
_MIGRATIONS: list[list[str]] = [
    [
        "CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 0),"
        " revision INTEGER NOT NULL, compact_revision INTEGER NOT NULL)",
        # etcd starts at revision 1: the first write makes revision 2.
        "INSERT INTO meta VALUES (0, 1, 0)",
        # Keys are UTF-8 BLOBs so that SQLite's memcmp order is etcd's byte order.
        "CREATE TABLE kv (key BLOB PRIMARY KEY, value BLOB NOT NULL,"
        " create_rev INTEGER NOT NULL, mod_rev INTEGER NOT NULL,"
        " version INTEGER NOT NULL, lease INTEGER NOT NULL) WITHOUT ROWID",
        "CREATE INDEX kv_lease ON kv (lease)",
        # One row per event; sub orders a transaction's writes within its revision.
        "CREATE TABLE history (rev INTEGER NOT NULL, sub INTEGER NOT NULL, key BLOB NOT NULL,"
        " deleted INTEGER NOT NULL, value BLOB NOT NULL, create_rev INTEGER NOT NULL,"
        " version INTEGER NOT NULL, lease INTEGER NOT NULL, PRIMARY KEY (rev, sub)) WITHOUT ROWID",
        "CREATE INDEX history_key ON history (key, rev, sub)",
        # AUTOINCREMENT: a revoked lease's id is never handed out again.
        "CREATE TABLE leases (id INTEGER PRIMARY KEY AUTOINCREMENT, ttl REAL NOT NULL)",
    ],
]
SCHEMA_VERSION = len(_MIGRATIONS)

_WATCH_WINDOW = 1000  # revisions read per watch query, so a long replay streams in pieces
_EXPIRY_RETRY_S = 1.0  # after a failed lease revoke, try again this much later

_SELECT_KV = "SELECT key, value, create_rev, mod_rev, version, lease FROM kv"
_ABOVE_ALL = b"\xff"  # no UTF-8 string holds the byte 0xff, so every key sorts below it
# The keys live at an older revision: each key's last event up to it, if that was a put.
_RANGE_AT = (
    "SELECT key, value, create_rev, rev, version, lease FROM ("
    " SELECT *, ROW_NUMBER() OVER (PARTITION BY key ORDER BY rev DESC, sub DESC) AS nth"
    " FROM history WHERE rev <= ? AND key >= ? AND key < ?)"
    " WHERE nth = 1 AND NOT deleted ORDER BY key LIMIT ?"
)


class SqliteStoreError(Exception):
    """The file is not a usable llmgw store: not SQLite, corrupt, foreign, or too new."""


def _bounds(key: str, end: str | None) -> tuple[bytes, bytes]:
    """[low, high) in bytes for etcd's [key, end), for SQL's "key >= ? AND key < ?"."""
    low = key.encode()
    if end is None:
        return low, low + b"\0"  # the next key after key in byte order: just key
    if end == "\0":  # etcd: every key >= key
        return low, _ABOVE_ALL
    return low, end.encode()


def _kv(row: Sequence[Any]) -> KV:
    """A KV from a row of (key, value, create_rev, mod_rev, version, lease)."""
    return KV(bytes(row[0]).decode(), bytes(row[1]), row[2], row[3], row[4], row[5])


def _order(actual: int | bytes, operand: int | bytes) -> int:
    """-1, 0 or 1 as actual is below, equal to or above operand; both must be of one kind."""
    if isinstance(actual, bytes) and isinstance(operand, bytes | bytearray):
        return (actual > operand) - (actual < operand)
    if isinstance(actual, int) and isinstance(operand, int) and not isinstance(operand, bool):
        return (actual > operand) - (actual < operand)
    raise TypeError(f"cannot compare {actual!r} with {operand!r}")


def _holds(op: str, order: int) -> bool:
    """Whether a Compare's op holds for an order from _order."""
    return {"=": order == 0, "!=": order != 0, "<": order < 0, ">": order > 0}[op]


class _Writer:
    """One write request in progress; all its writes share the revision after the current one."""

    def __init__(self, conn: sqlite3.Connection, revision: int) -> None:
        self.conn = conn
        self.rev = revision + 1
        self.writes = 0

    def put(self, key: str, value: bytes, lease: int) -> None:
        """Set key, keeping its create revision and counting its version."""
        if (
            lease
            and not self.conn.execute("SELECT 1 FROM leases WHERE id = ?", (lease,)).fetchone()
        ):
            raise KeyError(f"lease {lease} not found")
        k = key.encode()
        prev = self.conn.execute(
            "SELECT create_rev, version FROM kv WHERE key = ?", (k,)
        ).fetchone()
        create, version = (prev[0], prev[1] + 1) if prev else (self.rev, 1)
        self.conn.execute(
            "INSERT OR REPLACE INTO kv (key, value, create_rev, mod_rev, version, lease)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (k, value, create, self.rev, version, lease),
        )
        self._record(k, False, value, create, version, lease)

    def delete(self, key: str, end: str | None) -> int:
        """Delete the keys in [key, end); returns how many there were."""
        sql = "SELECT key FROM kv WHERE key >= ? AND key < ? ORDER BY key"
        keys = [r[0] for r in self.conn.execute(sql, _bounds(key, end))]
        for k in keys:
            self.conn.execute("DELETE FROM kv WHERE key = ?", (k,))
            self._record(k, True, b"", 0, 0, 0)
        return len(keys)

    def get(self, key: str, end: str | None) -> list[KV]:
        """The keys in [key, end), seeing this request's earlier writes (as etcd's txn does)."""
        sql = _SELECT_KV + " WHERE key >= ? AND key < ? ORDER BY key"
        return [_kv(r) for r in self.conn.execute(sql, _bounds(key, end))]

    def holds(self, c: Compare) -> bool:
        """Whether one compare holds on the current state."""
        row = self.conn.execute(
            "SELECT value, create_rev, mod_rev, version FROM kv WHERE key = ?", (c.key.encode(),)
        ).fetchone()
        actual: int | bytes
        if c.target == "value":
            if row is None:  # etcd: a value compare on a missing key never holds
                return False
            actual = bytes(row[0])
        else:
            actual = 0 if row is None else row[{"create": 1, "mod": 2, "version": 3}[c.target]]
        return _holds(c.op, _order(actual, c.operand))

    def _record(
        self, key: bytes, deleted: bool, value: bytes, create: int, version: int, lease: int
    ) -> None:
        """Append one event to the history."""
        self.conn.execute(
            "INSERT INTO history VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (self.rev, self.writes, key, deleted, value, create, version, lease),
        )
        self.writes += 1


class _Db:
    """The SQL side of the store; every method runs on the store's one worker thread."""

    def __init__(self, conn: sqlite3.Connection, keep_revisions: int) -> None:
        self.conn = conn
        self.keep = keep_revisions
        row = conn.execute("SELECT revision, compact_revision FROM meta").fetchone()
        self.revision: int = row[0]
        self.compact_revision: int = row[1]
        self.stored_leases = self.leases()  # read here so a failure closes the file in open()

    @classmethod
    def open(cls, path: str, keep_revisions: int) -> _Db:
        """Open (or create) the file, check it and bring its schema up to date."""
        try:
            conn = sqlite3.connect(path, isolation_level=None)
        except sqlite3.Error as e:
            raise SqliteStoreError(f"{path}: cannot open the store: {e}") from e
        try:
            _prepare(conn, path)
            return cls(conn, keep_revisions)
        except sqlite3.DatabaseError as e:
            conn.close()
            raise SqliteStoreError(f"{path}: not a usable llmgw store: {e}") from e
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        """Close the connection (which checkpoints the WAL into the file)."""
        self.conn.close()

    def current(self) -> int:
        """The current revision."""
        return self.revision

    def snapshot_to(self, path: str) -> int:
        """The whole store as of now copied into the new file at path (SQLite's online
        backup, page by page: no copy held in memory); its keys."""
        copy = sqlite3.connect(path)
        try:
            self.conn.backup(copy)
            return int(copy.execute("SELECT count(*) FROM kv").fetchone()[0])
        finally:
            copy.close()

    def leases(self) -> list[tuple[int, float]]:
        """Every live lease as (id, ttl)."""
        return [(r[0], r[1]) for r in self.conn.execute("SELECT id, ttl FROM leases")]

    def range(self, key: str, end: str | None, limit: int, revision: int) -> tuple[list[KV], int]:
        """Keys in [key, end) at revision (0: now), and the current revision."""
        if revision < 0 or revision > self.revision:
            raise ValueError(f"revision {revision} is not in [0, {self.revision}]")
        if 0 < revision < self.compact_revision:
            raise CompactedError(
                f"revision {revision} is compacted (kept from {self.compact_revision})"
            )
        low, high = _bounds(key, end)
        if revision in (0, self.revision):
            sql = _SELECT_KV + " WHERE key >= ? AND key < ? ORDER BY key LIMIT ?"
            rows = self.conn.execute(sql, (low, high, limit or -1)).fetchall()
        else:
            rows = self.conn.execute(_RANGE_AT, (revision, low, high, limit or -1)).fetchall()
        return [_kv(r) for r in rows], self.revision

    def get(self, key: str) -> KV | None:
        """The key's current value, or None."""
        row = self.conn.execute(_SELECT_KV + " WHERE key = ?", (key.encode(),)).fetchone()
        return None if row is None else _kv(row)

    def put(self, key: str, value: bytes, lease: int) -> int:
        """Set a key; returns the new revision."""
        self._write(lambda w: w.put(key, value, lease))
        return self.revision

    def delete(self, key: str, end: str | None) -> tuple[int, int]:
        """Delete [key, end); returns (count, revision)."""
        return self._write(lambda w: w.delete(key, end)), self.revision

    def txn(
        self,
        compare: list[Compare],
        success: list[Put | Delete | Get],
        failure: list[Put | Delete | Get],
    ) -> TxnResult:
        """Run success or failure, as the compares say, in one write transaction."""

        def body(w: _Writer) -> tuple[bool, list[list[KV]]]:
            ok = all(w.holds(c) for c in compare)
            responses: list[list[KV]] = []
            for op in success if ok else failure:
                if isinstance(op, Put):
                    w.put(op.key, op.value, op.lease)
                elif isinstance(op, Delete):
                    w.delete(op.key, op.end)
                else:
                    responses.append(w.get(op.key, op.end))
            return ok, responses

        ok, responses = self._write(body)
        return TxnResult(ok, self.revision, responses)

    def lease_grant(self, ttl_s: float) -> int:
        """Record a new lease; returns its id."""
        cur = self.conn.execute("INSERT INTO leases (ttl) VALUES (?)", (ttl_s,))
        assert cur.lastrowid is not None  # an INSERT always sets it
        return cur.lastrowid

    def lease_revoke(self, lease: int) -> int:
        """Delete a lease and its keys (one revision for all); returns the revision after."""

        def body(w: _Writer) -> None:
            if not self.conn.execute("DELETE FROM leases WHERE id = ?", (lease,)).rowcount:
                raise KeyError(f"lease {lease} not found")
            keys = self.conn.execute("SELECT key FROM kv WHERE lease = ? ORDER BY key", (lease,))
            for (k,) in keys.fetchall():
                w.delete(bytes(k).decode(), None)

        self._write(body)
        return self.revision

    def events(self, key: str, end: str | None, start: int) -> tuple[list[Event], int, bool]:
        """Events on [key, end) from start, a window at a time.

        Returns the events, the last revision they cover, and whether that is the current one.
        """
        if start <= self.compact_revision:
            raise CompactedError(
                f"revision {start} is compacted (kept from {self.compact_revision + 1})"
            )
        upto = min(self.revision, start + _WATCH_WINDOW - 1)
        rows = self.conn.execute(
            "SELECT rev, sub, key, deleted, value, create_rev, version, lease FROM history"
            " WHERE rev BETWEEN ? AND ? AND key >= ? AND key < ? ORDER BY rev, sub",
            (start, upto, *_bounds(key, end)),
        ).fetchall()
        return [self._event(r) for r in rows], upto, upto >= self.revision

    def _event(self, row: Sequence[Any]) -> Event:
        """The event for a history row, with the key's previous value when it had one."""
        rev, sub, k, deleted, value, create, version, lease = row
        key = bytes(k).decode()
        prev = self.conn.execute(
            "SELECT deleted, value, create_rev, rev, version, lease FROM history"
            " WHERE key = ? AND (rev, sub) < (?, ?) ORDER BY rev DESC, sub DESC LIMIT 1",
            (k, rev, sub),
        ).fetchone()
        prev_kv = None if prev is None or prev[0] else KV(key, bytes(prev[1]), *prev[2:])
        if deleted:
            return Event("delete", KV(key, b"", 0, rev, 0), prev_kv)
        return Event("put", KV(key, bytes(value), create, rev, version, lease), prev_kv)

    def _write(self, body: Callable[[_Writer], T]) -> T:
        """Run body in one SQLite transaction; the revision grows by one if it wrote anything."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            w = _Writer(self.conn, self.revision)
            result = body(w)
            compacted = None
            if w.writes:
                self.conn.execute("UPDATE meta SET revision = ?", (w.rev,))
                compacted = self._compact(w.rev)
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        if w.writes:  # only once committed, so a failed write leaves the counters as they were
            self.revision = w.rev
        if compacted is not None:
            self.compact_revision = compacted
        return result

    def _compact(self, revision: int) -> int | None:
        """Drop history older than keep_revisions (in batches); returns the new compact revision.

        Each key's last put at or before the compact revision stays, so reads at it still work.
        """
        target = revision - self.keep
        if target - self.compact_revision < max(1, self.keep // 10):
            return None
        self.conn.execute(
            "DELETE FROM history WHERE rev <= :t AND (deleted OR EXISTS ("
            " SELECT 1 FROM history AS later WHERE later.key = history.key AND later.rev <= :t"
            " AND (later.rev, later.sub) > (history.rev, history.sub)))",
            {"t": target},
        )
        self.conn.execute("UPDATE meta SET compact_revision = ?", (target,))
        return target


def _prepare(conn: sqlite3.Connection, path: str) -> None:
    """Set the connection up (WAL, full sync), check the file and migrate its schema."""
    conn.execute("PRAGMA journal_mode = WAL")  # the first read: fails on a file that is not SQLite
    conn.execute("PRAGMA synchronous = FULL")  # writes are rare and each must survive a crash
    conn.execute("PRAGMA busy_timeout = 5000")
    problems = [r[0] for r in conn.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        raise SqliteStoreError(f"{path}: the store is corrupt: {'; '.join(problems[:5])}")
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise SqliteStoreError(
            f"{path}: schema version {version} is newer than this llmgwd's ({SCHEMA_VERSION})"
        )
    if version == 0 and conn.execute("SELECT 1 FROM sqlite_master").fetchone():
        raise SqliteStoreError(f"{path}: an SQLite file, but not an llmgw store")
    for v in range(version, SCHEMA_VERSION):
        conn.execute("BEGIN IMMEDIATE")
        for statement in _MIGRATIONS[v]:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {v + 1}")
        conn.execute("COMMIT")


@dataclass(slots=True)
class _Lease:
    """A live lease as the expiry task sees it: its TTL and when it runs out (monotonic)."""

    ttl_s: float
    deadline: float


class SqliteStore:
    """The embedded store: one SQLite file, one writer (this llmgwd), watchers woken in-process.

    Use open(), not the constructor. All SQL runs on one worker thread, in order.
    """

    def __init__(
        self, db: _Db, executor: ThreadPoolExecutor, revision: int, leases: dict[int, _Lease]
    ) -> None:
        self._db = db
        self._executor = executor
        self._rev = revision  # the latest revision the loop has seen committed
        self._leases = leases  # kept in memory: keepalives are frequent and need no disk write
        self._closed = False
        self._changed = asyncio.Event()  # replaced by a fresh one on every write
        self._lease_added = asyncio.Event()
        self._expiry: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, path: str | Path, *, keep_revisions: int = 10000) -> SqliteStore:
        """Open or create the store at path (":memory:" for a throwaway one).

        Leases found in the file get their full TTL again, as etcd does on a new leader.
        """
        if keep_revisions < 1:
            raise ValueError("keep_revisions must be at least 1")
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmgwd-store")
        loop = asyncio.get_running_loop()
        try:
            db = await loop.run_in_executor(executor, _Db.open, str(path), keep_revisions)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        now = time.monotonic()
        leases = {lease: _Lease(ttl, now + ttl) for lease, ttl in db.stored_leases}
        store = cls(db, executor, db.revision, leases)
        store._expiry = asyncio.create_task(store._expire_leases(), name="llmgwd-store-leases")
        return store

    async def get(self, key: str) -> KV | None:
        """The key's current value, or None."""
        return await self._call(self._db.get, key)

    async def range(
        self, key: str, end: str | None = None, *, limit: int = 0, revision: int = 0
    ) -> tuple[list[KV], int]:
        """Keys in [key, end) in key order at revision (0: now), and the current revision."""
        return await self._call(self._db.range, key, end, limit, revision)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Set a key; returns the new revision. KeyError for an unknown lease."""
        return self._advance(await self._call(self._db.put, key, value, lease))

    async def delete(self, key: str, end: str | None = None) -> tuple[int, int]:
        """Delete a key or the range [key, end); returns (count deleted, revision)."""
        count, rev = await self._call(self._db.delete, key, end)
        return count, self._advance(rev)

    async def txn(
        self,
        compare: list[Compare],
        success: list[Put | Delete | Get],
        failure: list[Put | Delete | Get] | None = None,
    ) -> TxnResult:
        """Atomically: if every compare holds run success, else failure."""
        result = await self._call(self._db.txn, compare, success, failure or [])
        self._advance(result.revision)
        return result

    def watch(
        self, key: str, end: str | None = None, *, start_revision: int = 0
    ) -> AsyncIterator[Event]:
        """Events on [key, end) from start_revision (0: after the revision current now).

        The iterator raises CompactedError when start_revision is no longer kept, and ends
        when the store is closed.
        """
        self._check_open()
        return self._watch(key, end, start_revision or self._rev + 1)

    async def revision(self) -> int:
        """The store's current revision."""
        return await self._call(self._db.current)

    async def snapshot_to(self, path: str | Path) -> int:
        """The whole store, consistent as of now, copied into a new state.db file at path
        (a backup, made page by page); the keys it holds."""
        return await self._call(self._db.snapshot_to, str(path))

    async def lease_grant(self, ttl_s: float) -> int:
        """A new lease; keys put with it are deleted when it expires or is revoked."""
        if ttl_s <= 0:
            raise ValueError("a lease's TTL must be positive")
        lease = await self._call(self._db.lease_grant, ttl_s)
        self._leases[lease] = _Lease(ttl_s, time.monotonic() + ttl_s)
        self._lease_added.set()
        return lease

    async def lease_keepalive(self, lease: int) -> float:
        """Renew a lease; returns its TTL. Raises KeyError for an unknown or expired lease."""
        self._check_open()
        held = self._leases.get(lease)
        now = time.monotonic()
        if held is None or held.deadline <= now:
            raise KeyError(f"lease {lease} not found or expired")
        held.deadline = now + held.ttl_s
        return held.ttl_s

    async def lease_revoke(self, lease: int) -> None:
        """End a lease now, deleting its keys. Raises KeyError for an unknown lease."""
        self._check_open()
        if self._leases.pop(lease, None) is None:
            raise KeyError(f"lease {lease} not found or expired")
        self._advance(await self._call(self._db.lease_revoke, lease))

    async def close(self) -> None:
        """Stop lease expiry, end every watch and close the file. Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        self._changed.set()
        # The worker runs jobs in order, so any SQL already queued finishes before this.
        await asyncio.get_running_loop().run_in_executor(self._executor, self._db.close)
        self._executor.shutdown(wait=False)

    async def _watch(self, key: str, end: str | None, start: int) -> AsyncIterator[Event]:
        """Replay history from start, then follow new writes, reading events back from SQL."""
        next_rev = start
        while not self._closed:
            changed = self._changed  # taken before reading, so no write slips between
            events, upto, current = await self._call(self._db.events, key, end, next_rev)
            for event in events:
                yield event
            next_rev = max(next_rev, upto + 1)
            if current:
                await changed.wait()

    async def _expire_leases(self) -> None:
        """Revoke each lease when its deadline passes; sleeps until the next deadline. Ends
        once the store is closed: a cancel that Python 3.11's wait_for swallows (its inner
        wait done at the same moment) must not leave it retrying on a closed file for ever."""
        while not self._closed:
            now = time.monotonic()
            for lease in [i for i, held in self._leases.items() if held.deadline <= now]:
                await self._expire(lease)
            self._lease_added.clear()
            deadlines = [held.deadline for held in self._leases.values()]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lease_added.wait(), timeout)

    async def _expire(self, lease: int) -> None:
        """Revoke one expired lease; on a failure keep it and retry a little later."""
        held = self._leases.pop(lease, None)
        if held is None or self._closed:  # revoked by its owner meanwhile, or closing
            return
        try:
            self._advance(await self._call(self._db.lease_revoke, lease))
        except KeyError:
            pass  # already gone from the file
        except Exception:
            log.exception("revoking expired lease %d failed; retrying", lease)
            held.deadline = time.monotonic() + _EXPIRY_RETRY_S
            self._leases[lease] = held

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run fn on the SQL thread."""
        self._check_open()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def _check_open(self) -> None:
        """Refuse work once closed."""
        if self._closed:
            raise RuntimeError("the store is closed")

    def _advance(self, revision: int) -> int:
        """Note a committed revision and wake the watchers; returns it."""
        if revision > self._rev:
            self._rev = revision
            woken, self._changed = self._changed, asyncio.Event()
            woken.set()
        return revision
