"""Usage counted in memory on the request path and merged into the store in batches.

Keys: /usage/<YYYY-MM-DD>/<key id>/<model>, each holding that day's counts, merged with
compare-and-set so several control planes (or a flush retried) add up instead of overwriting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import msgspec

from llmgwd.store import KV, Compare, Delete, Get, Put, Store, prefix_end

log = logging.getLogger(__name__)

USAGE = "/usage/"
BATCH = 64  # records per transaction (etcd allows 128 operations in one)
MAX_TRIES = 20  # compare-and-set rounds before a batch waits for the next flush

Row = tuple[str, str, str]  # (day, key id, model)


class Counts(msgspec.Struct, kw_only=True):
    """One day's usage of one model by one key, as stored."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    spend_pico: int = 0  # money in 1e-12 units: sums stay exact

    def merge(self, other: Counts) -> Counts:
        """The sum of two counts."""
        return Counts(
            requests=self.requests + other.requests,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            spend_pico=self.spend_pico + other.spend_pico,
        )


_dec = msgspec.json.Decoder(Counts)
_enc = msgspec.json.Encoder()


def usage_key(row: Row) -> str:
    """The store key of a (day, key id, model) row."""
    return f"{USAGE}{row[0]}/{row[1]}/{row[2]}"


def parse_key(key: str) -> Row:
    """The (day, key id, model) of a usage store key (a model name may hold a slash)."""
    day, key_id, model = key[len(USAGE) :].split("/", 2)
    return day, key_id, model


@dataclass(frozen=True, slots=True)
class Record:
    """One row of usage with its counts."""

    day: str
    key_id: str
    model: str
    counts: Counts


class Usage:
    """The counts not yet in the store, a flusher writing them every interval_s, and reads
    that add the store's counts to those in memory.

    add is synchronous and touches only memory; the store sees nothing until a flush. The
    flusher is stopped (not cancelled) so its last flush completes: stop() writes everything.
    """

    def __init__(self, store: Store | None, *, interval_s: float = 5.0) -> None:
        self._store = store
        self._interval_s = interval_s
        self._pending: dict[Row, list[int]] = {}
        self._lock = asyncio.Lock()  # one flush at a time, and reads never see a half-flush
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add(self, row: Row, prompt: int, completion: int, picos: int) -> None:
        """Count one answered request (the request path: memory only)."""
        counts = self._pending.get(row)
        if counts is None:
            self._pending[row] = [1, prompt, completion, picos]
        else:
            counts[0] += 1
            counts[1] += prompt
            counts[2] += completion
            counts[3] += picos

    def pending(self) -> int:
        """How many rows wait for the next flush."""
        return len(self._pending)

    def start(self) -> None:
        """Run the flusher in the background until stop()."""
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop the flusher after one last flush of everything counted."""
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
        else:
            await self.flush()

    async def _run(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval_s)
            await self._flush_logged()
        await self._flush_logged()  # what was counted while the last one was writing

    async def _flush_logged(self) -> None:
        try:
            await self.flush()
        except Exception:  # the store is down: the counts wait in memory for the next try
            log.exception("usage flush failed; %d rows kept for the next one", self.pending())

    async def flush(self) -> int:
        """Merge every pending row into the store; returns how many were written.

        Rows that could not be written go back to pending, added to what came meanwhile.
        """
        if self._store is None or not self._pending:
            return 0
        async with self._lock:
            batch, self._pending = self._pending, {}
            rows = list(batch.items())
            written = 0
            try:
                for i in range(0, len(rows), BATCH):
                    await self._merge(self._store, rows[i : i + BATCH])
                    written = i + len(rows[i : i + BATCH])
            finally:
                for row, counts in rows[written:]:
                    self._put_back(row, counts)
            return written

    def _put_back(self, row: Row, counts: list[int]) -> None:
        mine = self._pending.setdefault(row, [0, 0, 0, 0])
        for i, n in enumerate(counts):
            mine[i] += n

    async def _merge(self, store: Store, rows: list[tuple[Row, list[int]]]) -> None:
        """Add rows to their stored counts in one transaction, again if another writer won."""
        for _ in range(MAX_TRIES):
            compares: list[Compare] = []
            puts: list[Put | Delete | Get] = []
            for row, counts in rows:
                key = usage_key(row)
                kv = await store.get(key)
                add = _counts(counts)
                compares.append(_unchanged(key, kv))
                puts.append(Put(key, _enc.encode(_dec.decode(kv.value).merge(add) if kv else add)))
            if (await store.txn(compares, puts)).succeeded:
                return
        raise RuntimeError(f"usage rows kept changing under {MAX_TRIES} merges")

    async def records(self, since_day: str) -> list[Record]:
        """Every row from since_day on: the store's counts plus those not flushed yet."""
        async with self._lock:
            merged: dict[Row, Counts] = {}
            if self._store is not None:
                kvs, _ = await self._store.range(USAGE + since_day, prefix_end(USAGE))
                merged = {parse_key(kv.key): _dec.decode(kv.value) for kv in kvs}
            for row, counts in self._pending.items():
                if row[0] >= since_day:
                    merged[row] = merged.get(row, Counts()).merge(_counts(counts))
        return [Record(*row, counts) for row, counts in sorted(merged.items())]


def _unchanged(key: str, kv: KV | None) -> Compare:
    """The compare that holds while key is as read (or still absent)."""
    if kv is None:
        return Compare(key, "version", "=", 0)
    return Compare(key, "mod", "=", kv.mod_revision)


def _counts(counts: list[int]) -> Counts:
    requests, prompt, completion, picos = counts
    return Counts(
        requests=requests, prompt_tokens=prompt, completion_tokens=completion, spend_pico=picos
    )
