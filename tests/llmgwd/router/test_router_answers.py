"""What a client gets of an engine's answer (issue 9): pooled connections the engine had closed,
engine internals kept back, engine refusals in OpenAI's shape."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd.router import Router
from tests.llmgwd.router.test_router_v1 import (
    CHAT,
    MODEL,
    USER_SECRET,
    FakeKeys,
    FakeModels,
    FakePool,
    assert_error_shape,
    endpoint,
    serve,
)

HEADERS = {"Authorization": f"Bearer {USER_SECRET}"}


@asynccontextmanager
async def router_to(url: str) -> AsyncIterator[tuple[str, Router]]:
    """The router in front of one engine replica ("r1") at url."""
    router = Router(FakeKeys(), FakeModels(MODEL), FakePool({MODEL: [endpoint(url)]}))
    async with serve(router) as base:
        yield base, router


async def post(http: aiohttp.ClientSession, base: str, body: dict[str, Any]) -> tuple[int, str]:
    async with http.post(f"{base}/v1/chat/completions", json=body, headers=HEADERS) as r:
        return r.status, await r.text()


# Pooled connections the engine had closed (finding 3).


@dataclass
class Closing:
    """What the engine does with its connections, shared by all of them."""

    drop_idle: bool = False  # a connection that answered a plain request is closed when reused
    drop_all: bool = False  # every request's connection is closed before any answer byte
    answered: int = 0


class HttplibLike(asyncio.Protocol):
    """llama-server's cpp-httplib: `Keep-Alive: timeout=5, max=100` on every answer, and the
    connection ended after a streamed answer without saying so. Here the end shows when the
    next request arrives on it (the FIN not yet seen by the router, the race made certain)."""

    def __init__(self, closing: Closing) -> None:
        self.closing, self.buffer, self.dead = closing, b"", False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length")
            ),
            0,
        )
        if not sep or len(rest) < length:
            return
        self.buffer = rest[length:]
        if self.dead or self.closing.drop_all:
            self.transport.close()  # no byte of an answer
            return
        self.closing.answered += 1
        asked_close = b"connection: close" in head.lower()
        if json.loads(rest[:length]).get("stream"):
            self._stream(asked_close)
        else:
            self._plain()

    def _plain(self) -> None:
        body = json.dumps(
            {
                "object": "chat.completion",
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hi"},
                        "finish_reason": "stop",
                    }
                ],
            }
        ).encode()
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        self.dead = self.closing.drop_idle

    def _stream(self, asked_close: bool) -> None:
        keep = b"Connection: close" if asked_close else b"Keep-Alive: timeout=5, max=100"
        self.transport.write(
            b"HTTP/1.1 200 OK\r\n" + keep + b"\r\nContent-Type: "
            b"text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = {
            "object": "chat.completion.chunk",
            "model": MODEL,
            "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}],
        }
        for event in (b"data: " + json.dumps(chunk).encode() + b"\n\n", b"data: [DONE]\n\n"):
            self.transport.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.transport.write(b"0\r\n\r\n")
        if asked_close:
            self.transport.close()
        else:
            self.dead = True  # llama-server has closed it; the router has not seen that yet


@asynccontextmanager
async def httplib_like(closing: Closing) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: HttplibLike(closing), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def test_a_request_after_a_stream_is_answered_and_the_replica_not_failed() -> None:
    closing = Closing()
    async with httplib_like(closing) as url, router_to(url) as (base, router):
        async with aiohttp.ClientSession() as http:
            for _ in range(5):  # more than the failures that take a replica out
                stream, _ = await post(http, base, {**CHAT, "stream": True})
                plain, _ = await post(http, base, CHAT)
                assert (stream, plain) == (200, 200)
        assert not router.balancer.ejections.out("r1")
    assert closing.answered == 10


async def test_a_pooled_connection_found_closed_is_replaced_by_a_fresh_one() -> None:
    closing = Closing(drop_idle=True)  # the engine's keep-alive ran out as the router reused it
    async with httplib_like(closing) as url, router_to(url) as (base, router):
        async with aiohttp.ClientSession() as http:
            statuses = [(await post(http, base, CHAT))[0] for _ in range(5)]
        assert statuses == [200] * 5
        assert not router.balancer.ejections.out("r1")
    assert closing.answered == 5  # each request reached the engine once


async def test_an_engine_closing_a_fresh_connection_is_a_502_and_counts() -> None:
    closing = Closing(drop_all=True)  # it had the request and answered nothing
    async with httplib_like(closing) as url, router_to(url) as (base, router):
        async with aiohttp.ClientSession() as http:
            status, text = await post(http, base, CHAT)
            assert status == 502
            assert_error_shape(json.loads(text), "upstream_error")
            for _ in range(2):
                await post(http, base, CHAT)
        assert router.balancer.ejections.out("r1")


async def test_a_replica_address_the_client_cannot_use_is_a_502_in_openais_shape() -> None:
    # Only plain http is spoken to engines.
    async with router_to("https://127.0.0.1:1") as (base, _), aiohttp.ClientSession() as http:
        status, text = await post(http, base, CHAT)
    assert status == 502
    assert_error_shape(json.loads(text), "upstream_error")


# Engine internals kept back (finding 4) and engine refusals in OpenAI's shape (finding 9).

PATH = "/work/models/SmolLM2-135M-Instruct.Q4_1.gguf"  # what llama.cpp puts in "model"
TIMINGS = {"cache_n": 30, "prompt_n": 1, "prompt_ms": 39.3, "predicted_n": 3}
USAGE = {
    "completion_tokens": 3,
    "prompt_tokens": 31,
    "total_tokens": 34,
    "prompt_tokens_details": {"cached_tokens": 30},
}
ANSWER = {
    "choices": [
        {"finish_reason": "length", "index": 0, "message": {"role": "assistant", "content": "Hai,"}}
    ],
    "created": 1796289949,
    "model": PATH,
    "system_fingerprint": "b0-unknown",
    "object": "chat.completion",
    "usage": USAGE,
    "id": "chatcmpl-1",
    "timings": TIMINGS,
}  # llama-server's answer, as it was seen


def _chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> dict[str, Any]:
    return {
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
        "created": 1796289949,
        "id": "chatcmpl-2",
        "model": PATH,
        "system_fingerprint": "b0-unknown",
        "object": "chat.completion.chunk",
        **more,
    }


STREAM = [
    _chunk({"role": "assistant", "content": None}),
    _chunk({"content": "Hello"}),
    _chunk({}, "length"),
    {**_chunk({}), "choices": [], "usage": USAGE, "timings": TIMINGS},
]


@dataclass
class Recorded:
    """An engine that answers what it is told to: llama-server's recorded words."""

    status: int = 200
    body: Any = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if (await request.json()).get("stream") and self.status == 200:
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            for chunk in STREAM:
                await out.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await out.write(b"data: [DONE]\n\n")
            return out
        return web.json_response(self.body or ANSWER, status=self.status)


@pytest.fixture
async def recorded() -> AsyncIterator[tuple[Recorded, str]]:
    engine = Recorded()
    app = web.Application()
    app.router.add_post("/v1/{path:.+}", engine.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    async with router_to(str(server.make_url("")).rstrip("/")) as (base, _):
        yield engine, base
    await server.close()


def assert_no_internals(text: str) -> None:
    for word in ("timings", "cache_n", "cached_tokens", "system_fingerprint", PATH):
        assert word not in text


async def test_plain_answers_carry_no_engine_internals(recorded: tuple[Recorded, str]) -> None:
    _, base = recorded
    async with aiohttp.ClientSession() as http:
        status, text = await post(http, base, CHAT)
    assert status == 200
    assert_no_internals(text)
    answer = json.loads(text)
    # Asked of the engine as a stream and folded (router/folding.py): STREAM's chunks as one
    # chat.completion, with OpenAI's fields only.
    assert set(answer) == {"id", "object", "created", "model", "choices", "usage"}
    assert (answer["object"], answer["model"], answer["id"]) == (
        "chat.completion",
        MODEL,
        "chatcmpl-2",
    )
    assert answer["usage"] == {"completion_tokens": 3, "prompt_tokens": 31, "total_tokens": 34}
    message = {"role": "assistant", "content": "Hello"}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}
    assert answer["choices"] == [choice]


@pytest.mark.parametrize("include_usage", [False, True])
async def test_streamed_answers_carry_no_engine_internals(
    recorded: tuple[Recorded, str], include_usage: bool
) -> None:
    _, base = recorded
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": include_usage}}
    async with aiohttp.ClientSession() as http:
        status, text = await post(http, base, body)
    assert status == 200
    assert_no_internals(text)
    events = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["model"] for c in chunks} == {MODEL}
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:3]) == "Hello"
    usage = [c["usage"] for c in chunks if "usage" in c]
    assert usage == (
        [{"completion_tokens": 3, "prompt_tokens": 31, "total_tokens": 34}] if include_usage else []
    )


def _llama_error(code: int, message: str, kind: str, **more: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "type": kind, **more}}


@pytest.mark.parametrize(
    ("status", "body", "expect", "code", "param", "says"),
    [
        (
            500,
            _llama_error(
                500,
                'Failed to parse tools: Expected \'tools\' to be an array, got "x"; tools = "x"',
                "server_error",
            ),
            400,
            "invalid_request",
            "tools",
            "'tools' could not be read",
        ),
        (
            500,
            _llama_error(
                500,
                'Failed to parse messages: Missing \'role\' in message: {"content":"hi"}',
                "server_error",
            ),
            400,
            "invalid_request",
            "messages",
            "'messages' could not be read",
        ),
        (
            400,
            _llama_error(
                400,
                "Field 'temperature': [json.exception.type_error.302] type "
                "must be number, but is string",
                "invalid_request_error",
            ),
            400,
            "invalid_request",
            "temperature",
            "Invalid value for 'temperature'.",
        ),
        (
            500,
            _llama_error(500, "tools param requires --jinja flag", "server_error"),
            400,
            "model_not_supported",
            "model",
            f"The model '{MODEL}' does not support tools.",
        ),
        (
            400,
            _llama_error(
                400,
                "request (3001 tokens) exceeds the available context size "
                "(2048 tokens), try increasing it",
                "exceed_context_size_error",
                n_prompt_tokens=3001,
                n_ctx=2048,
            ),
            400,
            "context_length_exceeded",
            "messages",
            "maximum context length is 2048",
        ),
        (
            500,
            _llama_error(500, "got exception: failed to decode", "server_error"),
            502,
            "upstream_error",
            None,
            "engine failed",
        ),
        (
            401,
            _llama_error(401, "Invalid API Key", "authentication_error"),
            502,
            "upstream_error",
            None,
            "engine failed",
        ),
    ],
)
async def test_engine_refusals_reach_the_client_in_openai_shape(
    recorded: tuple[Recorded, str],
    status: int,
    body: dict[str, Any],
    expect: int,
    code: str,
    param: str | None,
    says: str,
) -> None:
    engine, base = recorded
    engine.status, engine.body = status, body
    async with aiohttp.ClientSession() as http:
        got, text = await post(http, base, CHAT)
    assert got == expect
    answer = json.loads(text)
    assert_error_shape(answer, code, param)
    assert says in answer["error"]["message"]
    for internal in ("--jinja", "json.exception", "try increasing", "got exception", "Failed to"):
        assert internal not in text


async def test_the_openai_client_sees_a_bad_request_for_its_mistake(
    recorded: tuple[Recorded, str],
) -> None:
    engine, base = recorded
    engine.status = 500
    engine.body = _llama_error(500, "Failed to parse tools: bad", "server_error")
    async with openai.AsyncOpenAI(
        base_url=f"{base}/v1", api_key=USER_SECRET, max_retries=0
    ) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}]
            )
    assert caught.value.code == "invalid_request"


# An engine that read the request, worked on it, then died: no retry, no other replica.


class DiesOnSecond(asyncio.Protocol):
    """Answers the first request with keep-alive; reads the second, works on it for a while
    (past the window in which a closed pooled connection fails), then dies: it closes the
    connection and stops listening, as a crashed engine."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if b"\r\n\r\n" not in data:  # the fake's requests arrive whole (small, local)
            return
        self.state["read"] += 1
        if self.state["read"] == 1:
            body = json.dumps({"object": "chat.completion", "model": MODEL, "choices": []})
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode())
            )
            return
        asyncio.get_running_loop().call_later(0.3, self._die)

    def _die(self) -> None:
        self.state["server"].close()
        self.transport.close()


async def test_an_engine_dying_on_a_request_gets_a_502_and_no_other_replica_sees_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llmgwd.router import proxy
    from tests.llmgwd.router.test_router_v1 import FakeEngine, running

    monkeypatch.setattr(proxy, "_STALE_WINDOW_S", 0.05)  # the engine dies 0.3 s after reading
    state: dict[str, Any] = {"read": 0}
    loop = asyncio.get_running_loop()
    state["server"] = await loop.create_server(lambda: DiesOnSecond(state), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{state['server'].sockets[0].getsockname()[1]}"
    async with running(FakeEngine()) as other:
        endpoints = [endpoint(url, "dies"), endpoint(other.url, "other")]
        router = Router(FakeKeys(), FakeModels(MODEL), FakePool({MODEL: endpoints}))
        async with serve(router) as base, aiohttp.ClientSession() as http:
            with router.balancer.hold(endpoints[1]):  # busier: the dying one is tried first
                first, _ = await post(http, base, CHAT)  # leaves a pooled connection
                status, text = await post(http, base, CHAT)
    state["server"].close()
    assert (first, status) == (200, 502)
    assert_error_shape(json.loads(text), "upstream_error")
    assert state["read"] == 2 and not other.seen  # not sent again, nor to another replica


# An engine answering 5xx counts against its replica; a client's fault does not.


@asynccontextmanager
async def answering(engine: Recorded) -> AsyncIterator[tuple[str, Router]]:
    app = web.Application()
    app.router.add_post("/v1/{path:.+}", engine.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with router_to(str(server.make_url("")).rstrip("/")) as routed:
            yield routed
    finally:
        await server.close()


@pytest.mark.parametrize(
    ("message", "status", "out"),
    [("CUDA error: out of memory", 502, True), ("Failed to parse messages", 400, False)],
)
async def test_engine_500s_eject_the_replica_unless_the_client_was_at_fault(
    message: str, status: int, out: bool
) -> None:
    engine = Recorded(500, {"error": {"code": 500, "message": message, "type": "server_error"}})
    async with answering(engine) as (base, router), aiohttp.ClientSession() as http:
        statuses = [(await post(http, base, CHAT))[0] for _ in range(3)]
        assert statuses == [status] * 3
        assert router.balancer.ejections.out("r1") is out
