"""llama-server opens a Messages stream with message_start, and a Responses stream with
response.created, only in its first token's event, which it holds back while that token is part
of a character: "Write one emoji." gets a stream with neither (llama_answers/fold/, recorded).
The router opens such a stream itself, folds it into a whole answer, charges it, and never
takes the replica out for it (the fuzz of issue 26 found 502s that took the model offline)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd.router import Balancer, Router, folding
from llmgwd.router.metering import Meter
from llmgwd.router.v1_routes import MESSAGES
from tests.llmgwd.router.test_router_metering import LimitedKeys, PricedModels
from tests.llmgwd.router.test_router_v1 import MODEL, USER_SECRET, FakePool, endpoint
from tests.llmgwd.router.test_router_v1 import serve as serve_router

FOLD = Path(__file__).parent / "llama_answers" / "fold"
EMOJI: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Write one emoji."}]


@dataclass
class Gateway:
    url: str
    meter: Meter
    asked: list[bool]  # each request asked the engine for a stream

    async def charged(self) -> tuple[int, int, int]:
        c = (await self.meter.usage.records(""))[0].counts
        return c.requests, c.prompt_tokens, c.completion_tokens


def recorded(name: str, asked: list[bool]) -> web.Application:
    async def answer(request: web.Request) -> web.StreamResponse:
        asked.append((await request.json()).get("stream") is True)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write((FOLD / name).read_bytes())
        return out

    app = web.Application()
    app.router.add_post("/v1/messages", answer)
    app.router.add_post("/v1/responses", answer)
    return app


@pytest.fixture
async def gw(request: pytest.FixtureRequest) -> AsyncIterator[Gateway]:
    asked: list[bool] = []
    server = TestServer(recorded(request.param, asked), host="127.0.0.1")
    await server.start_server()
    pool = FakePool({MODEL: [endpoint(str(server.make_url("")).rstrip("/"))]}, {MODEL: 1})
    meter = Meter()
    router = Router(LimitedKeys(), PricedModels(), pool, meter=meter, balancer=Balancer(pool))
    async with serve_router(router) as url:
        yield Gateway(url, meter, asked)
    await server.close()


def claude(gw: Gateway) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gw.url, api_key=USER_SECRET, max_retries=0)


@pytest.mark.parametrize("gw", ["messages_emoji.sse"], indirect=True)
async def test_a_whole_message_without_message_start_is_answered(gw: Gateway) -> None:
    async with claude(gw) as client:
        for _ in range(4):  # three such 502s took the replica out before
            answer = await client.messages.create(model=MODEL, messages=EMOJI, max_tokens=4)
    assert [(b.type, getattr(b, "text", None)) for b in answer.content] == [("text", "🌟")]
    assert answer.stop_reason == "max_tokens" and answer.usage.output_tokens == 4
    assert gw.asked == [True] * 4
    # The engine never told the prompt's tokens: its bound (the body's bytes) is charged.
    body = {"max_tokens": 4, "messages": EMOJI, "model": MODEL}
    requests, prompt, completion = await gw.charged()
    assert (requests, completion) == (4, 16)
    assert prompt >= 4 * len(json.dumps(body, separators=(",", ":")))


@pytest.mark.parametrize("gw", ["messages_emoji.sse"], indirect=True)
async def test_a_message_stream_without_message_start_opens_with_one(gw: Gateway) -> None:
    async with (
        claude(gw) as client,
        client.messages.stream(model=MODEL, messages=EMOJI, max_tokens=4) as stream,
    ):
        events = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert events[0] == "message_start"
    assert final.content[0].type == "text" and final.content[0].text == "🌟"
    assert final.model == MODEL
    requests, prompt, completion = await gw.charged()
    assert (requests, completion) == (1, 4) and prompt > 0


@pytest.mark.parametrize("gw", ["responses_partial.sse"], indirect=True)
async def test_a_responses_stream_without_response_created_opens_with_one(gw: Gateway) -> None:
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=USER_SECRET) as client:
        stream = await client.responses.create(model=MODEL, input="\u0090000", stream=True)
        events = [e async for e in stream]
    assert [e.type for e in events] == ["response.created", "response.completed"]
    created = events[0].response  # type: ignore[union-attr]
    assert created.status == "in_progress" and created.output == [] and created.model == MODEL
    assert await gw.charged() == (1, 35, 1)


def test_the_fold_of_a_message_without_message_start_says_no_prompt_count() -> None:
    folder = folding.Folder(MESSAGES)
    folder.feed((FOLD / "messages_emoji.sse").read_bytes())
    message = json.loads(folder.answer())
    assert message["content"] == [{"type": "text", "text": "🌟"}]
    assert message["usage"] == {"output_tokens": 4}
