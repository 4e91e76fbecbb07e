"""etcd backend of the store: the Store interface on an etcd 3.4+ member's JSON gateway."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

from llmgwd.store.base import KV, CompactedError, Compare, Delete, Event, Get, Put, TxnResult
from llmgwd.store.etcd_http import (
    CALL_TIMEOUT_S,
    NOT_FOUND,
    OUT_OF_RANGE,
    EtcdError,
    EtcdHttp,
    EtcdUnavailable,
    Json,
    b64,
    tls_context,
    unb64,
)

log = logging.getLogger(__name__)

OPEN_WAIT_S = 60.0  # how long open() waits for the member to answer (it may be starting)
KEEPALIVE_TIMEOUT_S = CALL_TIMEOUT_S  # a keepalive is a stream: no call's timeout of its own
_RECONNECT_S = (0.05, 0.2, 0.5, 1.0, 2.0)  # pauses between a cut watch's reconnects
_TARGETS = {"version": "VERSION", "create": "CREATE", "mod": "MOD", "value": "VALUE"}
_FIELDS = {"version": "version", "create": "create_revision", "mod": "mod_revision"}
_RESULTS = {"=": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}


def _int(value: object) -> int:
    """An int64 field of the gateway's JSON (a string; absent when 0)."""
    return int(value) if isinstance(value, (str, int)) else 0


def _kv(data: Json) -> KV:
    return KV(
        unb64(data.get("key")).decode(),
        unb64(data.get("value")),
        _int(data.get("create_revision")),
        _int(data.get("mod_revision")),
        _int(data.get("version")),
        _int(data.get("lease")),
    )


def _revision(answer: Json) -> int:
    return _int(answer.get("header", {}).get("revision"))


def _range_body(key: str, end: str | None) -> Json:
    if end is None:
        return {"key": b64(key)}
    # etcd refuses the empty key; from "\0" on is the same range, as no key is empty.
    return {"key": b64(key or "\0"), "range_end": b64(end)}


def _compare(c: Compare) -> Json:
    body: Json = {"key": b64(c.key), "target": _TARGETS[c.target], "result": _RESULTS[c.op]}
    if c.target == "value":
        body["value"] = b64(c.operand if isinstance(c.operand, bytes) else str(c.operand))
    else:
        body[_FIELDS[c.target]] = str(c.operand)
    return body


def _op(op: Put | Delete | Get) -> Json:
    if isinstance(op, Put):
        put: Json = {"key": b64(op.key), "value": b64(op.value)}
        if op.lease:
            put["lease"] = str(op.lease)
        return {"request_put": put}
    if isinstance(op, Delete):
        return {"request_delete_range": _range_body(op.key, op.end)}
    return {"request_range": _range_body(op.key, op.end)}


def _event(data: Json) -> Event:
    prev = data.get("prev_kv")
    kind: Literal["put", "delete"] = "delete" if data.get("type") == "DELETE" else "put"
    return Event(kind, _kv(data.get("kv", {})), _kv(prev) if prev else None)


def _refused(e: EtcdError) -> Exception:
    """The Store interface's exception for an etcd error, or the error itself."""
    if e.code == NOT_FOUND and "lease not found" in e.message:
        return KeyError("no such lease")
    if e.code == OUT_OF_RANGE and "compacted" in e.message:
        return CompactedError("the revision asked for has been compacted")
    if e.code == OUT_OF_RANGE and "future revision" in e.message:
        return ValueError("the revision asked for is newer than the store's")
    return e


class EtcdStore:
    """The store on etcd: each call one request to the member (linearizable reads)."""

    def __init__(self, client: EtcdHttp) -> None:
        self._client = client
        self._closed = False
        self._stopped = asyncio.Event()

    @classmethod
    async def open(
        cls,
        endpoint: str,
        *,
        ca_file: Path,
        cert_file: Path,
        key_file: Path,
        wait_s: float = OPEN_WAIT_S,
    ) -> EtcdStore:
        """Connect to a member with the cluster CA's client certificate; wait for it to answer."""
        store = cls(EtcdHttp(endpoint, tls_context(ca_file, cert_file, key_file)))
        loop = asyncio.get_running_loop()
        until = loop.time() + wait_s
        while True:
            try:
                await store.revision()
                return store
            except EtcdError as e:
                if loop.time() >= until:
                    await store.close()
                    raise
                log.info("waiting for etcd at %s: %s", endpoint, e.message)
                await asyncio.sleep(1.0)

    async def _call(self, path: str, body: Json) -> Json:
        if self._closed:
            raise RuntimeError("the store is closed")
        try:
            return await self._client.call(path, body)
        except EtcdError as e:
            raise _refused(e) from None

    async def get(self, key: str) -> KV | None:
        kvs, _ = await self.range(key)
        return kvs[0] if kvs else None

    async def range(
        self, key: str, end: str | None = None, *, limit: int = 0, revision: int = 0
    ) -> tuple[list[KV], int]:
        body = _range_body(key, end)
        if limit:
            body["limit"] = str(limit)
        if revision:
            body["revision"] = str(revision)
        answer = await self._call("/v3/kv/range", body)
        return [_kv(kv) for kv in answer.get("kvs", [])], _revision(answer)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        body: Json = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        return _revision(await self._call("/v3/kv/put", body))

    async def delete(self, key: str, end: str | None = None) -> tuple[int, int]:
        answer = await self._call("/v3/kv/deleterange", _range_body(key, end))
        return _int(answer.get("deleted")), _revision(answer)

    async def txn(
        self,
        compare: list[Compare],
        success: list[Put | Delete | Get],
        failure: list[Put | Delete | Get] | None = None,
    ) -> TxnResult:
        body: Json = {
            "compare": [_compare(c) for c in compare],
            "success": [_op(op) for op in success],
            "failure": [_op(op) for op in failure or []],
        }
        answer = await self._call("/v3/kv/txn", body)
        responses = [
            [_kv(kv) for kv in r["response_range"].get("kvs", [])]
            for r in answer.get("responses", [])
            if "response_range" in r
        ]
        return TxnResult(bool(answer.get("succeeded")), _revision(answer), responses)

    def watch(
        self, key: str, end: str | None = None, *, start_revision: int = 0
    ) -> AsyncIterator[Event]:
        if self._closed:
            raise RuntimeError("the store is closed")
        return self._watch(key, end, start_revision)

    async def revision(self) -> int:
        return _revision(await self._call("/v3/kv/range", {"key": b64("\0"), "count_only": True}))

    async def lease_grant(self, ttl_s: float) -> int:
        answer = await self._call("/v3/lease/grant", {"TTL": str(max(1, math.ceil(ttl_s)))})
        return _int(answer.get("ID"))

    async def lease_keepalive(self, lease: int) -> float:
        if self._closed:
            raise RuntimeError("the store is closed")
        try:
            async with asyncio.timeout(KEEPALIVE_TIMEOUT_S):
                async for result in self._client.stream("/v3/lease/keepalive", {"ID": str(lease)}):
                    ttl = _int(result.get("TTL"))
                    if ttl <= 0:  # etcd answers an unknown or expired lease with TTL 0
                        raise KeyError("no such lease")
                    return float(ttl)
        except EtcdError as e:
            raise _refused(e) from None
        except TimeoutError:
            raise EtcdUnavailable(self._client.endpoint, "no answer to a lease keepalive") from None
        raise EtcdUnavailable(self._client.endpoint, "no answer to a lease keepalive")

    async def lease_revoke(self, lease: int) -> None:
        await self._call("/v3/kv/lease/revoke", {"ID": str(lease)})

    async def leases(self) -> list[int]:
        """Every live lease's id (etcd's LeaseLeases; not in the Store interface)."""
        answer = await self._call("/v3/lease/leases", {})
        return [_int(lease.get("ID")) for lease in answer.get("leases", [])]

    async def is_leader(self) -> bool:
        """Whether this client's member is etcd's Raft leader now (not llmgw's leader)."""
        answer = await self._call("/v3/maintenance/status", {})
        member = answer.get("header", {}).get("member_id")
        return member is not None and member == answer.get("leader")

    async def compact(self, revision: int) -> None:
        """Drop the history before revision (etcd's compaction; not in the Store interface)."""
        await self._call("/v3/kv/compaction", {"revision": str(revision), "physical": True})

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stopped.set()
        await self._client.close()

    async def _watch(self, key: str, end: str | None, start: int) -> AsyncIterator[Event]:
        """Follow [key, end) from start; after a cut, again from the revision after the last
        one seen (or after the one the watch was created at). Ends when the store closes."""
        next_rev = start
        failures = 0
        while not self._closed:
            body: Json = {"create_request": {**_range_body(key, end), "prev_kv": True}}
            if next_rev:
                body["create_request"]["start_revision"] = str(next_rev)
            try:
                async for result in self._client.stream("/v3/watch", body):
                    failures = 0
                    if _int(result.get("compact_revision")):
                        raise CompactedError("the watch's start revision has been compacted")
                    if result.get("created") and not next_rev:
                        next_rev = _revision(result) + 1
                    for data in result.get("events", []):
                        event = _event(data)
                        next_rev = event.kv.mod_revision + 1
                        yield event
                    if result.get("canceled"):
                        raise EtcdError(1, str(result.get("cancel_reason") or "watch canceled"))
            except EtcdError as e:
                if self._closed:
                    return
                level = logging.WARNING if failures == 0 else logging.DEBUG  # once per outage
                log.log(level, "etcd watch cut (%s); again from revision %d", e.message, next_rev)
            if await self._pause(_RECONNECT_S[min(failures, len(_RECONNECT_S) - 1)]):
                return
            failures += 1

    async def _pause(self, seconds: float) -> bool:
        """Sleep, or less if the store closes; whether it closed."""
        try:
            await asyncio.wait_for(self._stopped.wait(), seconds)
        except TimeoutError:
            return False
        return True
