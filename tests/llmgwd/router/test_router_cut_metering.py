"""Every token an engine makes is charged, on every generating route, whether the client stays,
leaves mid-stream or leaves a whole answer it waits for (issue 26, findings 1 and 2): the engine
is told when the client leaves and stops, and what it sent until then is what the key pays."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd.router import Balancer, Router
from llmgwd.router.metering import Meter
from tests.llmgwd.router.test_router_metering import LimitedKeys, PricedModels
from tests.llmgwd.router.test_router_v1 import ENGINE_KEY, MODEL, USER_SECRET, FakePool, endpoint
from tests.llmgwd.router.test_router_v1 import serve as serve_router

PROMPT = 11  # the prompt tokens every engine answer says it read
TOKENS = 40  # the tokens an answer has when nobody leaves


def _sse(doc: dict[str, Any], name: str | None = None) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def _chat(i: int | None, usage: bool) -> bytes:
    if i is None:  # the end: its finish chunk, then usage (when asked) and [DONE]
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        done = _sse({"choices": [], "usage": _usage(TOKENS)}) if usage else b""
        return _sse(end) + done + b"data: [DONE]\n\n"
    if i < 0:
        return _sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]})
    return _sse({"choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}]})


def _completion(i: int | None, usage: bool) -> bytes:
    if i is None:
        last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
        return _sse({**last, "usage": _usage(TOKENS)} if usage else last) + b"data: [DONE]\n\n"
    if i < 0:
        return b""
    return _sse({"choices": [{"index": 0, "text": f"w{i} ", "finish_reason": None}]})


def _messages(i: int | None, _usage_asked: bool) -> bytes:
    if i is None:
        delta = {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                 "usage": {"output_tokens": TOKENS}}  # fmt: skip
        stop: dict[str, Any] = {"type": "content_block_stop", "index": 0}
        return (_sse(stop, "content_block_stop") + _sse(delta, "message_delta")
                + _sse({"type": "message_stop"}, "message_stop"))  # fmt: skip
    if i < 0:  # as llama-server: message_start says 0 output tokens
        message: dict[str, Any] = {
            "id": "m1", "type": "message", "role": "assistant", "content": [], "model": "x",
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": PROMPT, "output_tokens": 0},
        }  # fmt: skip
        start = {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }
        return _sse({"type": "message_start", "message": message}, "message_start") + _sse(
            start, "content_block_start"
        )
    token: dict[str, Any] = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": f"w{i} "},
    }
    return _sse(token, "content_block_delta")


def _responses(i: int | None, _usage_asked: bool) -> bytes:
    response: dict[str, Any] = {
        "id": "r1",
        "object": "response",
        "status": "in_progress",
        "model": "x",
        "output": [],
    }
    if i is None:
        text = {"type": "output_text", "text": "w", "annotations": []}
        item = {"type": "message", "id": "i1", "status": "completed", "role": "assistant",
                "content": [text]}  # fmt: skip
        usage = {"input_tokens": PROMPT, "output_tokens": TOKENS, "total_tokens": PROMPT + TOKENS}
        done = {**response, "status": "completed", "output": [item], "usage": usage}
        return _sse({"type": "response.completed", "response": done}, "response.completed")
    if i < 0:
        return _sse({"type": "response.created", "response": response}, "response.created")
    delta = {"type": "response.output_text.delta", "item_id": "i1", "output_index": 0,
             "content_index": 0, "delta": f"w{i} "}  # fmt: skip
    return _sse(delta, "response.output_text.delta")


def _usage(completion: int) -> dict[str, int]:
    return {"prompt_tokens": PROMPT, "completion_tokens": completion,
            "total_tokens": PROMPT + completion}  # fmt: skip


ROUTES = {"chat/completions": _chat, "completions": _completion, "messages": _messages,
          "responses": _responses}  # fmt: skip


@dataclass
class TokenEngine:
    """Streams TOKENS token events a gap_s apart on every generating route, as llama-server
    does, and stops when its client goes (TestServer cancels its handler)."""

    gap_s: float = 0.02
    made: int = 0  # tokens made and sent
    streamed: list[bool] = field(default_factory=list)  # each request asked for a stream
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        for path in ROUTES:
            app.router.add_post(f"/v1/{path}", self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        assert request.headers["Authorization"] == f"Bearer {ENGINE_KEY}"
        body = await request.json()
        self.streamed.append(body.get("stream") is True)
        event = ROUTES[request.path.removeprefix("/v1/")]
        usage = (body.get("stream_options") or {}).get("include_usage") is True
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        try:
            await out.write(event(-1, usage))
            for i in range(TOKENS):
                await out.write(event(i, usage))
                self.made += 1  # sent: what the client may be charged
                await asyncio.sleep(self.gap_s)
            await out.write(event(None, usage))
        finally:
            self.stopped.set()
        return out


@dataclass
class Bench:
    url: str
    engine: TokenEngine
    meter: Meter
    http: aiohttp.ClientSession

    async def charged(self, requests: int = 1) -> tuple[int, int, int]:
        """(requests, prompt, completion) counted once that many requests have settled."""
        for _ in range(500):
            records = await self.meter.usage.records("")
            if records and records[0].counts.requests >= requests:
                c = records[0].counts
                return c.requests, c.prompt_tokens, c.completion_tokens
            await asyncio.sleep(0.01)
        raise AssertionError("the requests were never settled")


@pytest.fixture
async def bench() -> AsyncIterator[Bench]:
    engine = TokenEngine()
    server = TestServer(engine.app(), host="127.0.0.1")
    await server.start_server()
    pool = FakePool({MODEL: [endpoint(str(server.make_url("")).rstrip("/"))]}, {MODEL: 1})
    meter = Meter()
    router = Router(LimitedKeys(), PricedModels(), pool, meter=meter, balancer=Balancer(pool),
                    disconnect_poll_s=0.02)  # fmt: skip
    async with serve_router(router) as url, aiohttp.ClientSession() as http:
        yield Bench(url, engine, meter, http)
    await server.close()


def _body(path: str, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "stream": stream}
    if path == "completions":
        body["prompt"] = "Once"
    elif path == "responses":
        body["input"] = "Once"
    else:
        body["messages"] = [{"role": "user", "content": "Once"}]
    body["max_output_tokens" if path == "responses" else "max_tokens"] = 100
    return body


@pytest.mark.parametrize("path", list(ROUTES))
async def test_a_stream_cut_early_is_charged_what_the_engine_made(bench: Bench, path: str) -> None:
    headers = {"Authorization": f"Bearer {USER_SECRET}"}
    url = f"{bench.url}/v1/{path}"
    resp = await bench.http.post(url, json=_body(path, True), headers=headers)
    assert resp.status == 200
    while bench.engine.made < 10:  # read ten tokens' events, then leave
        await resp.content.readany()
    resp.close()
    await asyncio.wait_for(bench.engine.stopped.wait(), 5)
    made = bench.engine.made
    assert 10 <= made < TOKENS  # the engine stopped when the client went
    assert await bench.charged() == (1, _prompt(path, True), made)


def _prompt(path: str, stream: bool) -> int:
    """The prompt tokens a request cut short is charged: the engine's count where it said it
    before the end (Messages' message_start), else the prompt's bound (its body's bytes)."""
    return PROMPT if path == "messages" else len(json.dumps(_body(path, stream)).encode())


@pytest.mark.parametrize("path", list(ROUTES))
async def test_a_whole_answer_the_client_left_is_charged_what_the_engine_made(
    bench: Bench, path: str
) -> None:
    headers = {"Authorization": f"Bearer {USER_SECRET}"}
    request = bench.http.post(f"{bench.url}/v1/{path}", json=_body(path, False), headers=headers)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(request, 0.3)  # the client gives up after 0.3 s
    await asyncio.wait_for(bench.engine.stopped.wait(), 5)
    made = bench.engine.made
    assert bench.engine.streamed == [True]  # asked of the engine as a stream
    assert 0 < made < TOKENS
    assert await bench.charged() == (1, _prompt(path, False), made)


@pytest.mark.parametrize("path", list(ROUTES))
async def test_an_answer_read_to_its_end_is_charged_the_engine_s_usage(
    bench: Bench, path: str
) -> None:
    bench.engine.gap_s = 0.0
    headers = {"Authorization": f"Bearer {USER_SECRET}"}
    for stream in (False, True):
        async with bench.http.post(
            f"{bench.url}/v1/{path}", json=_body(path, stream), headers=headers
        ) as resp:
            assert resp.status == 200
            await resp.read()
    assert bench.engine.made == 2 * TOKENS
    assert await bench.charged(2) == (2, 2 * PROMPT, 2 * TOKENS)
