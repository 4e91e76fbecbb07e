"""A fast OpenAI-shaped mock engine for bench/router: raw asyncio protocols on uvloop.

POST /v1/chat/completions answers at once with a usage block, or, with "stream": true,
as 64 SSE chunks 20 ms apart (then a usage chunk when stream_options.include_usage is
set, then [DONE]); all 64 in one write when the request's text says "at once" (WHOLE): the
router asks a stream for a client's whole answer and folds it, and a whole-answer figure is the
router's work, not the mock's pacing. GET /health answers {"status":"ok"}. Any Bearer key is
accepted: the router sends a key derived from its cluster secret. HTTP/1.1 keep-alive, bodies
by Content-Length only (every client the bench drives sends one).

    python mock.py --port 0 [--chunks 64 --gap-ms 20]   # prints "PORT <n>" when listening
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import cast

import msgspec
import uvloop


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class Ask(msgspec.Struct):
    """The only fields of a request the mock looks at; msgspec skips the rest cheaply."""

    stream: bool = False
    stream_options: StreamOptions | None = None


_ask = msgspec.json.Decoder(Ask)

USAGE = b'{"prompt_tokens":12,"completion_tokens":64,"total_tokens":76}'
COMPLETION = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"hello from the mock"},'
    b'"finish_reason":"stop"}],"usage":' + USAGE + b"}"
)
HEALTH = b'{"status":"ok"}'
WHOLE = b"at once"  # in a request's text: its stream in one write, no gaps


def _response(status: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


# Prebuilt: the mock must cost far less per request than anything it is compared with.
OK_COMPLETION = _response(b"200 OK", COMPLETION)
OK_HEALTH = _response(b"200 OK", HEALTH)
NOT_FOUND = _response(b"404 Not Found", b'{"error":{"message":"not found"}}')
BAD = _response(b"400 Bad Request", b'{"error":{"message":"bad request"}}')
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def _chunked(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: bytes) -> bytes:
    return _chunked(b"data: " + obj + b"\n\n")


def _delta(i: int) -> bytes:
    # "tokNN" lets the client check that every chunk arrived, whatever a proxy re-encodes.
    return _event(
        b'{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"bench","choices":[{"index":0,"delta":{"content":"tok%02d "},'
        b'"finish_reason":null}]}' % i
    )


FINISH = _event(
    b'{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"bench","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}'
)
USAGE_EVENT = _event(
    b'{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"bench","choices":[],"usage":' + USAGE + b"}"
)
DONE = _event(b"[DONE]") + b"0\r\n\r\n"


class Mock(asyncio.Protocol):
    """One client connection; requests are answered in order, one at a time."""

    chunks = 64
    gap_s = 0.02
    deltas: list[bytes] = []

    def __init__(self) -> None:
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._streaming = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()  # a stream whose client left stops at once
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while not self._streaming and self._transport is not None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._buf[:end])
            length = _content_length(head)
            if len(self._buf) < end + 4 + length:
                return
            body = bytes(self._buf[end + 4 : end + 4 + length])
            del self._buf[: end + 4 + length]
            self._answer(head, body)

    def _answer(self, head: bytes, body: bytes) -> None:
        assert self._transport is not None
        line = head[: head.find(b"\r\n")] if b"\r\n" in head else head
        parts = line.split(b" ")
        method, path = (parts[0], parts[1]) if len(parts) >= 2 else (b"", b"")
        if method == b"GET" and path == b"/health":
            self._transport.write(OK_HEALTH)
            return
        if method != b"POST" or not path.endswith(b"/chat/completions"):
            self._transport.write(NOT_FOUND)
            return
        try:
            ask = _ask.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self._transport.write(BAD)
            return
        if not ask.stream:
            self._transport.write(OK_COMPLETION)
            return
        usage = ask.stream_options is not None and ask.stream_options.include_usage
        if WHOLE in body:
            tail = FINISH + (USAGE_EVENT if usage else b"") + DONE
            self._transport.write(SSE_HEAD + b"".join(self.deltas) + tail)
            return
        self._streaming = True
        self._transport.write(SSE_HEAD)
        loop = asyncio.get_running_loop()
        self._send(loop, loop.time(), 0, usage)

    def _send(self, loop: asyncio.AbstractEventLoop, t0: float, i: int, usage: bool) -> None:
        """Chunk i now, the next on an absolute schedule so that late timers do not drift."""
        self._timer = None
        if self._transport is None:
            return
        if i < self.chunks:
            self._transport.write(self.deltas[i])
            self._timer = loop.call_at(
                t0 + (i + 1) * self.gap_s, self._send, loop, t0, i + 1, usage
            )
            return
        self._transport.write(FINISH + (USAGE_EVENT if usage else b"") + DONE)
        self._streaming = False
        if self._buf:  # a request that came in behind the stream
            self.data_received(b"")


def _content_length(head: bytes) -> int:
    lower = head.lower()
    at = lower.find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    end = lower.find(b"\r\n", at + 2)
    return int(lower[at + 17 : end if end > 0 else len(lower)].strip())


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    # A deep backlog: thousands of streams are opened within a second.
    server = await loop.create_server(Mock, host, port, backlog=8192, reuse_address=True)
    bound = server.sockets[0].getsockname()[1]
    print(f"PORT {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    args = parser.parse_args()
    Mock.chunks = args.chunks
    Mock.gap_s = args.gap_ms / 1000
    Mock.deltas = [_delta(i) for i in range(args.chunks)]
    if args.chunks > 100:
        sys.exit("mock: at most 100 chunks (the client checks tok00..tok99)")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
