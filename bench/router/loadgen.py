"""Load for bench/router: an open-loop fixed-rate generator and a streams client.

Raw asyncio protocols on uvloop, so that one core drives thousands of requests a second
with little noise of its own. Run by bench.py as a process pinned to a core; it prints
one JSON object.

    python loadgen.py rate '{"port": 8000, "path": "/v1/chat/completions", "key": "K",
                             "body": "...", "rps": 500, "duration_s": 5}'
    python loadgen.py streams '{"port": 8000, ..., "n": 1000, "ramp_s": 1.0}'

Rate: request i is due at t0 + i/rps whatever the answers do (open loop); its latency is
counted from when the generator dispatched it, so waiting for a free connection counts
against the server, the generator's own timer slack (about 1 ms on uvloop) does not.
Streams: n streams opened over ramp_s; every chunk carries "tokNN", so a chunk lost
anywhere shows as a missing NN, whatever a proxy re-encodes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import re
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import uvloop

now = time.perf_counter  # loop.time() is libuv's cached milliseconds: too coarse here


def raise_nofile() -> int:
    """Lift the soft fd limit to the hard one: 5,000 streams need 5,000 sockets here."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def build_request(cfg: dict[str, Any]) -> bytes:
    body = str(cfg["body"]).encode()
    head = (
        f"POST {cfg['path']} HTTP/1.1\r\n"
        f"Host: {cfg.get('host', '127.0.0.1')}:{cfg['port']}\r\n"
        f"Authorization: Bearer {cfg['key']}\r\n"
        "Content-Type: application/json\r\n"
        "Accept: */*\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Response:
    """An incremental HTTP/1.1 response parser: status, Content-Length or chunked body."""

    def __init__(self, on_body: Callable[[bytes], None] | None = None) -> None:
        self.status = 0
        self.done = False
        self.close_after = False
        self._buf = bytearray()
        self._head = True
        self._chunked = False
        self._left = 0  # Content-Length bytes still to come
        self._chunk_left = -1  # -1: at a chunk-size line
        self._on_body = on_body

    def feed(self, data: bytes) -> None:
        self._buf += data
        if self._head:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._buf[:end]).lower()
            del self._buf[: end + 4]
            self._head = False
            self.status = int(head[9:12])
            self._chunked = b"\r\ntransfer-encoding: chunked" in head
            self.close_after = b"\r\nconnection: close" in head
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                self._left = int(head[at + 17 : stop if stop > 0 else len(head)].strip())
            elif not self._chunked:
                self._left = 0
        if self._chunked:
            self._feed_chunked()
        else:
            take = bytes(self._buf[: self._left])
            del self._buf[: self._left]
            self._left -= len(take)
            if take and self._on_body is not None:
                self._on_body(take)
            if self._left <= 0:
                self.done = True

    def _feed_chunked(self) -> None:
        while not self.done:
            if self._chunk_left < 0:
                eol = self._buf.find(b"\r\n")
                if eol < 0:
                    return
                size = int(bytes(self._buf[:eol]).split(b";")[0], 16)
                del self._buf[: eol + 2]
                if size == 0:
                    self.done = True  # trailers, if any, are not waited for
                    return
                self._chunk_left = size
            if len(self._buf) < self._chunk_left + 2:
                return
            payload = bytes(self._buf[: self._chunk_left])
            del self._buf[: self._chunk_left + 2]
            self._chunk_left = -1
            if self._on_body is not None:
                self._on_body(payload)


# Open-loop rate


class RateConn(asyncio.Protocol):
    """One keep-alive connection that carries one request at a time."""

    def __init__(self, gen: RateGen) -> None:
        self.gen = gen
        self.transport: asyncio.Transport | None = None
        self.started = 0.0
        self.busy = False
        self.resp = Response()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: alike, no subclass
        self.gen.ready(self)

    def send(self, started: float) -> None:
        assert self.transport is not None
        self.started = started
        self.busy = True
        self.resp = Response()
        self.transport.write(self.gen.request)

    def data_received(self, data: bytes) -> None:
        if not self.busy:
            return
        self.resp.feed(data)
        if self.resp.done:
            self.busy = False
            self.gen.finished(self, self.started, self.resp.status)
            if self.resp.close_after and self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.gen.lost(self, self.started if self.busy else None)


@dataclass
class RateGen:
    host: str
    port: int
    request: bytes
    max_conns: int
    measure_from: float = 0.0
    idle: list[RateConn] = field(default_factory=list)
    conns: set[RateConn] = field(default_factory=set)
    opening: int = 0
    pending: collections.deque[float] = field(default_factory=collections.deque)
    latencies: list[float] = field(default_factory=list)
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    outstanding: int = 0
    peak_conns: int = 0

    def dispatch(self, at: float) -> None:
        self.outstanding += 1
        while self.idle:
            conn = self.idle.pop()
            if conn.transport is not None:
                conn.send(at)
                return
        self.pending.append(at)
        if len(self.conns) + self.opening < self.max_conns:
            self.open()

    def open(self) -> None:
        self.opening += 1
        loop = asyncio.get_running_loop()
        task = loop.create_task(
            loop.create_connection(lambda: RateConn(self), self.host, self.port)
        )
        task.add_done_callback(self._opened)

    def _opened(self, task: asyncio.Task[Any]) -> None:
        self.opening -= 1
        if task.cancelled():
            return
        if task.exception() is not None:
            self.errors[f"connect: {type(task.exception()).__name__}"] += 1
            if self.pending:  # the request that asked for it still needs a connection
                asyncio.get_running_loop().call_later(0.05, self.open)

    def ready(self, conn: RateConn) -> None:
        self.conns.add(conn)
        self.peak_conns = max(self.peak_conns, len(self.conns))
        self._next(conn)

    def _next(self, conn: RateConn) -> None:
        if self.pending:
            conn.send(self.pending.popleft())
        else:
            self.idle.append(conn)

    def finished(self, conn: RateConn, started: float, status: int) -> None:
        self.outstanding -= 1
        if started >= self.measure_from:
            self.statuses[status] += 1
            if 200 <= status < 300:
                self.latencies.append(now() - started)
        self._next(conn)

    def lost(self, conn: RateConn, started: float | None) -> None:
        self.conns.discard(conn)
        if started is not None:
            self.outstanding -= 1
            if started >= self.measure_from:
                self.errors["connection lost mid-request"] += 1
        if self.pending and len(self.conns) + self.opening < self.max_conns:
            self.open()


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    if not values:
        return {}
    values = sorted(values)
    n = len(values)

    def at(q: float) -> float:
        return round(values[min(n - 1, int(q * n))] * scale, 3)

    return {
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "p999": at(0.999),
        "max": round(values[-1] * scale, 3),
    }


async def run_rate(cfg: dict[str, Any]) -> dict[str, Any]:
    rps = float(cfg["rps"])
    duration = float(cfg["duration_s"])
    warmup = float(cfg.get("warmup_s", 0.5))
    gen = RateGen(
        cfg.get("host", "127.0.0.1"),
        int(cfg["port"]),
        build_request(cfg),
        int(cfg.get("max_conns", 256)),
    )
    # A few warm connections, so the first requests do not pay for connecting.
    for _ in range(min(gen.max_conns, int(cfg.get("warm_conns", 8)))):
        gen.open()
    for _ in range(200):
        if gen.opening == 0:
            break
        await asyncio.sleep(0.01)
    total = int(rps * (duration + warmup))
    t0 = now()
    gen.measure_from = t0 + warmup
    sent = 0
    lag: list[float] = []
    while sent < total:
        t = now()
        due = min(total, int((t - t0) * rps) + 1)
        while sent < due:
            lag.append(t - (t0 + sent / rps))
            gen.dispatch(t)
            sent += 1
        delay = t0 + sent / rps - now()
        await asyncio.sleep(delay if delay > 0 else 0)
    send_end = now()
    drain_until = send_end + float(cfg.get("drain_s", 5.0))
    while gen.outstanding > 0 and now() < drain_until:  # noqa: ASYNC110 (a deadline)
        await asyncio.sleep(0.01)
    unfinished = gen.outstanding
    for conn in list(gen.conns):
        if conn.transport is not None:
            conn.transport.close()
    window = send_end - gen.measure_from
    ok = len(gen.latencies)
    measured = sum(gen.statuses.values()) + sum(gen.errors.values()) + unfinished
    return {
        "target_rps": rps,
        "achieved_rps": round(ok / window, 1) if window > 0 else 0.0,
        "measured": measured,
        "ok": ok,
        "statuses": {str(k): v for k, v in sorted(gen.statuses.items())},
        "errors": dict(gen.errors),
        "unfinished": unfinished,
        "peak_conns": gen.peak_conns,
        "latency_ms": percentiles(gen.latencies),
        "send_lag_ms": percentiles(lag),
    }


# Streams

TOKEN = re.compile(rb"tok(\d\d)")


class StreamConn(asyncio.Protocol):
    """One streamed chat on its own connection: when each tokNN arrived, and how it ended."""

    def __init__(self, client: StreamClient, chunks: int) -> None:
        self.client = client
        self.chunks = chunks
        self.transport: asyncio.Transport | None = None
        self.sent = 0.0
        self.arrived: dict[int, float] = {}
        self.resp = Response(self._body)
        self.tail = b""
        self.usage = False
        self.done_marker = False
        self.finished = False
        self.cut = False  # closed by us at the time limit: unfinished, not lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: alike, no subclass
        self.sent = now()
        self.transport.write(self.client.request)
        self.client.opened(self)

    def _body(self, payload: bytes) -> None:
        t = now()
        text = self.tail + payload
        for m in TOKEN.finditer(text):
            self.arrived.setdefault(int(m.group(1)), t)
        if not self.usage and b'"prompt_tokens"' in text:
            self.usage = True
        if b"data: [DONE]" in text:
            self.done_marker = True
        self.tail = text[-16:]  # a token or marker cut between two reads is still seen

    def data_received(self, data: bytes) -> None:
        self.resp.feed(data)
        if self.resp.done and not self.finished:
            self.finished = True
            self.client.closed(self, None)
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.finished:
            self.finished = True
            if self.cut:
                self.client.closed(self, None)
            else:
                self.client.closed(self, exc or ConnectionResetError("closed before the end"))


@dataclass
class StreamClient:
    request: bytes
    chunks: int
    want_usage: bool
    active: int = 0
    peak: int = 0
    results: list[StreamConn] = field(default_factory=list)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    left: int = 0
    all_done: asyncio.Event = field(default_factory=asyncio.Event)

    def opened(self, conn: StreamConn) -> None:
        self.active += 1
        self.peak = max(self.peak, self.active)

    def closed(self, conn: StreamConn, exc: BaseException | None) -> None:
        self.active -= 1
        self.statuses[conn.resp.status] += 1
        if exc is not None:
            self.errors[f"{type(exc).__name__} after {len(conn.arrived)} chunks"] += 1
        self.results.append(conn)
        self._one_less()

    def failed(self, exc: BaseException) -> None:
        self.errors[f"connect: {type(exc).__name__}"] += 1
        self._one_less()

    def _one_less(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.all_done.set()


async def run_streams(cfg: dict[str, Any]) -> dict[str, Any]:
    n = int(cfg["n"])
    chunks = int(cfg.get("chunks", 64))
    ramp = float(cfg.get("ramp_s", 1.0))
    timeout = float(cfg.get("timeout_s", 30.0))
    host, port = cfg.get("host", "127.0.0.1"), int(cfg["port"])
    client = StreamClient(build_request(cfg), chunks, bool(cfg.get("want_usage", True)), left=n)
    loop = asyncio.get_running_loop()
    conns: list[StreamConn] = []

    async def one() -> None:
        conn = StreamConn(client, chunks)
        conns.append(conn)
        try:
            await loop.create_connection(lambda: conn, host, port)
        except OSError as e:
            client.failed(e)

    t0 = now()
    tasks: list[asyncio.Task[None]] = []
    for i in range(n):
        due = t0 + ramp * i / n
        if (delay := due - now()) > 0:
            await asyncio.sleep(delay)
        tasks.append(loop.create_task(one()))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(client.all_done.wait(), timeout)
    elapsed = now() - t0
    unfinished = [c for c in conns if not c.finished]
    for c in unfinished:
        c.cut = True
        if c.transport is not None:
            c.transport.close()
    for task in tasks:
        task.cancel()  # connects still in SYN retries must not hold the step up
    await asyncio.gather(*tasks, return_exceptions=True)
    return summarize_streams(client, n, chunks, len(unfinished), elapsed)


def summarize_streams(
    client: StreamClient, n: int, chunks: int, unfinished: int, elapsed: float
) -> dict[str, Any]:
    ttft: list[float] = []
    gaps: list[float] = []
    complete = lost = no_usage = 0
    for c in client.results:
        if c.resp.status != 200:
            continue
        if not c.cut:  # a stream that ended short of its chunks lost them
            lost += chunks - len(c.arrived)
        if 0 in c.arrived:
            ttft.append(c.arrived[0] - c.sent)
        times = [c.arrived[i] for i in range(chunks) if i in c.arrived]
        gaps.extend(b - a for a, b in itertools.pairwise(times))
        whole = len(c.arrived) == chunks and c.done_marker and c.resp.done
        if client.want_usage and not c.usage and not c.cut:
            no_usage += 1
            whole = False
        complete += whole
    return {
        "n": n,
        "complete": complete,
        "chunks_lost": lost,
        "without_usage": no_usage,
        "unfinished": unfinished,
        "peak_open": client.peak,
        "statuses": {str(k): v for k, v in sorted(client.statuses.items())},
        "errors": dict(client.errors),
        "elapsed_s": round(elapsed, 2),
        "ttft_ms": percentiles(ttft),
        "gap_ms": percentiles(gaps),
    }


def main() -> None:
    mode, cfg = sys.argv[1], json.loads(sys.argv[2])
    raise_nofile()
    run = {"rate": run_rate, "streams": run_streams}[mode]
    print(json.dumps(uvloop.run(run(cfg))), flush=True)


if __name__ == "__main__":
    main()
