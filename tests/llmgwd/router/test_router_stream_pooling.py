"""A stream's engine connection: vLLM's (uvicorn keeps it after a stream) goes back to the pool;
llama.cpp's is asked to close (llama-server drops what is sent on it next, unanswered)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd.router import Router
from tests.llmgwd.router.test_router_answers import HEADERS
from tests.llmgwd.router.test_router_v1 import (
    CHAT,
    MODEL,
    FakeKeys,
    FakeModels,
    FakePool,
    endpoint,
    serve,
)


class KeepAlive:
    """An engine that streams every answer and keeps its connections, as uvicorn does: the
    client ports it was reached from, one a connection, and the Connection headers it got."""

    def __init__(self) -> None:
        self.ports: set[int] = set()
        self.asked_close: list[bool] = []

    async def chat(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.ports.add(peer[1] if peer else 0)
        self.asked_close.append(request.headers.get("Connection", "").lower() == "close")
        assert (await request.json())["stream"] is True  # a whole answer is folded
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        chunk = {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": MODEL,
            "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
        await answer.write(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
        await answer.write_eof()
        return answer


@asynccontextmanager
async def engine() -> AsyncIterator[tuple[str, KeepAlive]]:
    e = KeepAlive()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", e.chat)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), e
    finally:
        await server.close()


@pytest.mark.parametrize(("kind", "connections"), [("vllm", 1), ("llama.cpp", 4)])
async def test_whole_answers_reuse_the_engine_connection_only_where_it_is_kept(
    kind: str, connections: int
) -> None:
    models = FakeModels(MODEL)
    model = models.get(MODEL)
    assert model is not None
    models.set(msgspec.structs.replace(model, engine=kind))
    async with engine() as (url, e):
        router = Router(FakeKeys(), models, FakePool({MODEL: [endpoint(url)]}))
        async with serve(router) as base, aiohttp.ClientSession() as http:
            for _ in range(4):
                async with http.post(
                    f"{base}/v1/chat/completions", json=CHAT, headers=HEADERS
                ) as r:
                    assert r.status == 200
                    assert (await r.json())["choices"][0]["message"]["content"] == "hi"
    assert len(e.ports) == connections
    assert e.asked_close == [kind != "vllm"] * 4
