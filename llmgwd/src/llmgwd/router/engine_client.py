"""The router's HTTP/1.1 client for engines: kept-alive connections pooled per replica, answers
parsed by httptools, bodies read as they arrive with the socket paused above a high-water mark.

aiohttp's client cost the router about 150 us of CPU a request (bench/router/engine_client.py),
a quarter of all it spends; this one does the little the router needs (a POST to a replica
it knows, by IP, in plain HTTP on the cluster's network) for a fraction of that. The router
decides what to do about each failure (router/proxy.py); this module only names it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import cast

import httptools

_HIGH_WATER = 256 * 1024  # body bytes held unread before the socket is paused
_LOW_WATER = 64 * 1024  # ... and resumed
_MAX_HEAD = 64 * 1024  # an answer's header section larger than this is refused
_UNSAFE = re.compile(r"[\r\n\0]")  # in a header, they would let a value write another header
_NO_BODY = (204, 304)
_ONE_WRITE = 64 * 1024  # a body shorter than this is sent in one write with the headers


class EngineError(Exception):
    """The exchange with an engine failed; the message names no address and no key."""


class ConnectFailed(EngineError):
    """The connection was refused or timed out: the engine never saw the request."""


class ConnectionLost(EngineError):
    """The connection closed or was reset before the answer ended."""

    def __init__(self, message: str, *, reused: bool, answered: bool) -> None:
        super().__init__(message)
        self.reused = reused  # it was a pooled connection
        self.answered = answered  # some byte of the answer had arrived


class ReadTimeout(EngineError):
    """No byte of the answer came for read_timeout_s."""


class BadAnswer(EngineError):
    """What came back is not HTTP/1.1 as this client reads it."""


class _Connection(asyncio.Protocol):
    """One TCP connection to an engine; it hands what it reads to the answer being read."""

    def __init__(self, client: EngineClient, base: str) -> None:
        self.client = client
        self.base = base
        self.transport = cast(asyncio.Transport, None)
        self.answer: Answer | None = None
        self.idle_since = 0.0
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.answer is None:  # bytes nobody asked for: the connection is not to be trusted
            self.transport.close()
            return
        self.answer.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        # The transport holds this protocol: without this, each closed connection would be
        # a reference cycle for the collector (nothing uses the transport once lost).
        self.transport = cast(asyncio.Transport, None)
        if self.answer is not None:
            self.answer.lost(exc)
            return
        self.client._drop(self)


class Answer:
    """An engine's answer: its status and headers once they came, its body read as it comes."""

    def __init__(self, conn: _Connection, reused: bool, poolable: bool, timeout_s: float) -> None:
        self.status = 0
        self.content_type = "application/octet-stream"
        self.reused = reused
        self._raw: list[tuple[bytes, bytes]] = []
        self._conn = conn
        self._poolable = poolable
        self._timeout_s = timeout_s
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._head_bytes = 0  # in the headers parsed
        self._fed = 0  # fed before the head was whole
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._whole = False  # read() waits for the whole body: never paused
        self._started = False  # a byte of the answer came
        self._has_head = False
        self._interim = False  # a 1xx answer is being read: the real one follows it
        self._until_close = False  # a body that ends when the connection does
        self._done = False
        self._closed = False
        self._error: EngineError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._heard = 0.0  # when the connection last brought bytes, or a wait began
        self._timer: asyncio.TimerHandle | None = None

    @property
    def headers(self) -> dict[str, str]:
        """The answer's headers, names lower-cased (the last of a repeated one)."""
        return {n.decode("latin-1").lower(): v.decode("latin-1") for n, v in self._raw}

    async def read(self) -> bytes:
        """The whole body."""
        self._whole = True
        if self._paused:
            self._resume()
        while not self._done:
            await self._wait()
        return self._take()

    async def readany(self) -> bytes:
        """The body that came since the last read, waited for if none did; b"" at its end."""
        while not self._chunks and not self._done:
            await self._wait()
        return self._take()

    def close(self) -> None:
        """Done with the answer: its connection goes back to the pool when the answer ended and
        both sides keep it alive, and is closed otherwise (an engine stops generating then)."""
        if self._closed:
            return
        self._closed = True
        conn = self._conn
        # Neither the connection nor the parser (which holds this answer's callbacks) keeps
        # the answer past its end: no reference cycle a request for the collector to find.
        conn.answer = None
        self._parser = None
        if not self._done:  # a reader still waiting is told now, not at its read timeout
            self._fail(
                ConnectionLost(
                    "the answer was closed before its end",
                    reused=self.reused,
                    answered=self._started,
                )
            )
        if conn.lost:
            return
        transport = conn.transport
        # A request body still unsent (an engine that answered early and stopped reading)
        # would be sent before the next request, or kept for as long as the engine stays.
        sent = transport.get_write_buffer_size() == 0
        keep = self._poolable and not self._paused
        if self._done and sent and keep and not transport.is_closing():
            conn.client._put(conn)
        elif self._done and sent:
            transport.close()
        else:
            transport.abort()

    def finish_writing(self) -> None:
        """Half-close the connection (a FIN): an engine that checks its client between tokens
        (llama-server, uvicorn's vLLM) stops generating, and what it sent until then can
        still be read. The connection is never pooled after it."""
        self._poolable = False
        conn = self._conn
        if not conn.lost and conn.transport.can_write_eof() and not conn.transport.is_closing():
            conn.transport.write_eof()

    # What the connection hands over.

    def feed(self, data: bytes) -> None:
        """Bytes read from the connection."""
        parser = self._parser
        if parser is None:  # closed: nobody reads this
            return
        self._started = True
        self._heard = self._loop.time()
        try:
            parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            cause = e.__context__  # what a callback of ours raised
            why = f"the engine's answer is not HTTP/1.1 ({type(e).__name__})"
            self._fail(cause if isinstance(cause, BadAnswer) else BadAnswer(why))
            self._conn.transport.close()
            return
        if not self._has_head:  # a head that never ends: httptools would gather it all
            self._fed += len(data)
            if self._fed > _MAX_HEAD:
                self._fail(BadAnswer("the engine's answer headers are too large"))
                self._conn.transport.close()

    def lost(self, exc: Exception | None) -> None:
        """The connection closed: the end of a body that runs until then, or a failure."""
        if self._done:
            return
        if self._has_head and self._until_close and exc is None:
            self._poolable = False
            self.on_message_complete()
            return
        why = type(exc).__name__ if exc is not None else "closed"
        self._fail(
            ConnectionLost(
                f"the engine's connection was lost ({why})",
                reused=self.reused,
                answered=self._started,
            )
        )

    # httptools' callbacks.

    def on_message_begin(self) -> None:
        """A message starts: after the answer's end, bytes nobody asked for."""
        if self._done:
            self._poolable = False

    def on_header(self, name: bytes, value: bytes) -> None:
        """One header of the answer."""
        if self._done:  # bytes past the answer's end: the connection is not reused
            self._poolable = False
            return
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > _MAX_HEAD:
            raise BadAnswer("the engine's answer headers are too large")
        self._raw.append((name, value))

    def on_headers_complete(self) -> None:
        """The status and headers are in."""
        if self._done:
            return
        parser = self._parser
        assert parser is not None  # it is calling
        status = parser.get_status_code()
        if status < 200:  # 100 Continue, 103 Early Hints: the answer is still to come
            self._raw = []
            self._interim = True
            return
        self.status = status
        self._poolable = self._poolable and parser.should_keep_alive()
        framed = status in _NO_BODY
        for name, value in self._raw:
            lower = name.lower()
            if lower == b"content-type":
                self.content_type = value.split(b";", 1)[0].strip().decode("latin-1").lower()
            elif lower in (b"content-length", b"transfer-encoding"):
                framed = True
        self._until_close = not framed
        self._has_head = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        """A piece of the body (chunked encoding already taken off)."""
        if self._done:
            return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._whole and not self._paused:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        """The answer ended (or a 1xx one did)."""
        if self._interim:
            self._interim = False
            return
        self._done = True
        self._wake()

    # Within this module.

    async def head(self) -> None:
        """Wait for the status and headers."""
        while not self._has_head:
            await self._wait()

    def _take(self) -> bytes:
        chunks = self._chunks
        if not chunks:
            if self._error is not None:
                raise self._error
            return b""
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._buffered = 0
        if self._paused:
            self._resume()
        return data

    def _resume(self) -> None:
        self._paused = False
        if not self._conn.lost:
            self._conn.transport.resume_reading()

    async def _wait(self) -> None:
        """Until the connection brings something, or read_timeout_s passes."""
        if self._error is not None:
            raise self._error
        loop = self._loop
        waiter = self._waiter = loop.create_future()
        self._heard = loop.time()
        self._timer = loop.call_at(self._heard + self._timeout_s, self._time_out)
        try:
            await waiter
        finally:
            self._timer.cancel()
            self._timer = self._waiter = None  # the timer holds this answer: no cycle
        if self._error is not None and not self._chunks:
            raise self._error

    def _time_out(self) -> None:
        """No answer came, or bytes came that did not end the wait (a head trickling in): the
        timer runs again from them."""
        due = self._heard + self._timeout_s
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._time_out)
            return
        self._fail(ReadTimeout(f"the engine sent nothing for {self._timeout_s:g} s"))

    def _fail(self, error: EngineError) -> None:
        if self._error is None and not self._done:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class EngineClient:
    """POSTs to engine replicas (`http://HOST:PORT`), each on a pooled connection if one is
    idle there, otherwise on a new one."""

    def __init__(
        self, *, connect_timeout_s: float, read_timeout_s: float, keepalive_s: float = 4.0
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._keepalive_s = keepalive_s
        self._idle: dict[str, list[_Connection]] = {}
        self._hosts: dict[str, tuple[str, int, str]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the pool's, and the sweeper's
        self._closed = False  # close() was called: nothing is pooled after it

    async def post(
        self,
        base: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        fresh: bool = False,
    ) -> Answer:
        """POST body to base + path; the answer once its headers came. fresh: on a connection
        of its own, closed after."""
        head = _head(self._host(base)[2], path, headers, len(body))
        conn = None if fresh else self._pooled(base)
        reused = conn is not None
        if conn is None:
            conn = await self._open(base)
        poolable = not fresh and not _asks_close(headers)
        answer = conn.answer = Answer(conn, reused, poolable, self._read_timeout_s)
        try:
            if len(body) < _ONE_WRITE:
                conn.transport.write(head + body)
            else:  # not copied
                conn.transport.writelines((head, body))
            await answer.head()
        except BaseException:
            answer.close()
            raise
        return answer

    async def close(self) -> None:
        """Close every idle connection; answers closed later close theirs."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conns in list(self._idle.values()):
            for conn in list(conns):
                conn.transport.close()
        self._idle.clear()

    def _put(self, conn: _Connection) -> None:
        """Pool an idle connection; idle ones are swept keepalive_s after, if still unused."""
        if self._closed:
            conn.transport.close()
            return
        loop = self._own_loop()
        conn.idle_since = loop.time()
        self._idle.setdefault(conn.base, []).append(conn)
        if self._sweeper is None:
            self._sweeper = loop.call_at(conn.idle_since + self._keepalive_s, self._sweep)

    def _own_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop; the pool and sweeper of another (a loop that ended) are forgotten:
        their sockets and timer belong to it."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop = loop
            self._idle = {}
            self._sweeper = None
        return loop

    def _drop(self, conn: _Connection) -> None:
        """A pooled connection closed."""
        idle = self._idle.get(conn.base)
        if idle is not None and conn in idle:
            idle.remove(conn)
            if not idle:
                del self._idle[conn.base]

    def _sweep(self) -> None:
        """Close the connections idle longer than keepalive_s, at every replica (one that
        went away never closes its own)."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        now, keepalive_s = loop.time(), self._keepalive_s
        for conns in list(self._idle.values()):  # the due time's own sum: no float mismatch
            for conn in [c for c in conns if c.idle_since + keepalive_s <= now]:
                self._drop(conn)
                conn.transport.close()
        if self._idle:  # again when the longest idle of those left reaches keepalive_s
            since = min(c.idle_since for conns in self._idle.values() for c in conns)
            self._sweeper = loop.call_at(since + self._keepalive_s, self._sweep)

    def _pooled(self, base: str) -> _Connection | None:
        """The connection to base used last, if it is still open and not idle too long (the
        others were idle longer: they are closed then)."""
        now = self._own_loop().time()
        idle = self._idle.get(base)
        while idle:
            conn = idle.pop()
            if conn.lost or conn.transport.is_closing():
                continue
            if now - conn.idle_since > self._keepalive_s:
                idle.append(conn)
                break
            if not idle:
                del self._idle[base]
            return conn
        for conn in self._idle.pop(base, []):  # none left, or all idle too long
            conn.transport.close()
        return None

    async def _open(self, base: str) -> _Connection:
        host, port, _ = self._host(base)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, protocol = await loop.create_connection(
                    lambda: _Connection(self, base), host, port
                )
        except TimeoutError:
            raise ConnectFailed("the engine did not accept a connection in time") from None
        except OSError as e:
            raise ConnectFailed(f"the engine refused the connection ({e.strerror})") from None
        return protocol

    def _host(self, base: str) -> tuple[str, int, str]:
        """base's host, port and Host header, worked out once."""
        known = self._hosts.get(base)
        if known is None:
            try:
                url = httptools.parse_url(base.encode())
            except httptools.HttpParserInvalidURLError:
                url = None
            if url is None or url.schema != b"http" or not url.host or url.port == 0:
                raise ValueError("an engine's address is http://HOST:PORT")
            host = url.host.decode()
            port = 80 if url.port is None else url.port
            if len(self._hosts) > 4096:  # replicas come and go: never a leak
                self._hosts.clear()
            name = f"[{host}]" if ":" in host else host
            known = self._hosts[base] = (host, port, f"{name}:{port}")
        return known


def _asks_close(headers: Mapping[str, str]) -> bool:
    """Whether the request's own headers ask for the connection to close after it."""
    for name, value in headers.items():
        if len(name) == 10 and name.lower() == "connection":
            return value.strip().lower() == "close"
    return False


def _head(host: str, path: str, headers: Mapping[str, str], length: int) -> bytes:
    """The request line and headers; ValueError for a header that would break them."""
    text = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    if (
        _UNSAFE.search(path)
        or _UNSAFE.search("".join(headers))
        or _UNSAFE.search("".join(headers.values()))
    ):
        raise ValueError("a header or path holds CR, LF or NUL")
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{text}Content-Length: {length}\r\n\r\n"
    return head.encode("latin-1")
