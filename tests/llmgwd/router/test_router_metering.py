"""Limits, budgets and accounting through the /v1 router, against the fake engine of
test_router_v1: exact under racing requests, OpenAI's 429s and headers, usage as the engine
reported it (streams too), and the model's token limits held before an engine sees a request."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from llmgwd.accounting.pricing import cost, from_pico
from llmgwd.accounting.usage import Counts
from llmgwd.catalog import ApiKey, KeyLimits, Model
from llmgwd.router import Balancer, Router
from llmgwd.router.metering import Meter
from llmgwd.router.token_bounds import Estimate
from tests.llmgwd.router.test_router_v1 import (  # noqa: F401 (engine: a fixture)
    CHAT,
    MODEL,
    STREAM_PROMPT_TOKENS,
    USER_SECRET,
    FakeEngine,
    FakePool,
    Gateway,
    assert_error_shape,
    endpoint,
    engine,
    serve,
)

TINY = "tiny"  # a model with a small context
FREE = "free"  # a model without limits or prices
PRICE_PROMPT, PRICE_COMPLETION = 1.0, 2.0  # per million tokens
MAX_TOKENS = 100  # MODEL's completion limit in the catalog
RACERS = 50
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]  # CHAT's
DURATION = re.compile(r"^(\d+m)?\d+(\.\d+)?s$|^\d+ms$")  # Go's: 20ms, 1.5s, 1m0s


class LimitedKeys:
    """The one user key, whose limits a test sets."""

    def __init__(self) -> None:
        self.key = ApiKey(id="key-user", name="u", hash="", prefix="sk-llmgw-u")

    def authenticate(self, secret: str) -> ApiKey | None:
        return self.key if secret == USER_SECRET else None

    def limit(self, **limits: Any) -> None:
        self.key = msgspec.structs.replace(self.key, limits=KeyLimits(**limits))


class PricedModels:
    def __init__(self) -> None:
        self.models = {
            MODEL: Model(
                name=MODEL,
                source="file:/m.gguf",
                max_tokens=MAX_TOKENS,
                price_prompt=PRICE_PROMPT,
                price_completion=PRICE_COMPLETION,
            ),
            TINY: Model(name=TINY, source="file:/t.gguf", context=50),
            FREE: Model(name=FREE, source="file:/f.gguf"),
        }

    def get(self, name: str) -> Model | None:
        return self.models.get(name)

    def all(self) -> list[Model]:
        return list(self.models.values())


@dataclass
class Metered:
    gw: Gateway
    meter: Meter
    keys: LimitedKeys

    @property
    def engine(self) -> FakeEngine:
        return self.gw.engine

    async def usage(self) -> dict[str, Counts]:
        """What was counted, by model."""
        return {r.model: r.counts for r in await self.meter.usage.records("")}


@pytest.fixture
async def m(engine: FakeEngine) -> AsyncIterator[Metered]:  # noqa: F811
    models = (MODEL, TINY, FREE)
    pool = FakePool({n: [endpoint(engine.url, n)] for n in models}, dict.fromkeys(models, 1))
    keys, meter = LimitedKeys(), Meter()
    balancer = Balancer(pool, slots=RACERS)  # racers all reach the engine: none waits in line
    router = Router(
        keys, PricedModels(), pool, max_body_bytes=64 * 1024, meter=meter, balancer=balancer
    )
    async with serve(router) as url, aiohttp.ClientSession() as http:
        yield Metered(Gateway(url, engine, pool, router, http), meter, keys)


def reserved(body: dict[str, Any]) -> int:
    """What the router reserves for body as Gateway.post sends it: its bytes and max_tokens."""
    return len(json.dumps(body).encode()) + int(body.get("max_tokens", MAX_TOKENS))


async def race(m: Metered, body: dict[str, Any]) -> list[tuple[int, Any, Any]]:
    """RACERS requests at once, the engine holding every answer until each request was either
    refused or reached it: the admitted ones hold their reservations all the while."""
    m.engine.gate = asyncio.Event()
    tasks = [asyncio.create_task(m.gw.post("/v1/chat/completions", body)) for _ in range(RACERS)]
    while sum(t.done() for t in tasks) + len(m.engine.seen) < RACERS:
        await asyncio.wait([t for t in tasks if not t.done()], timeout=0.01)
    m.engine.gate.set()
    return list(await asyncio.gather(*tasks))


# Exact under racing requests.


async def test_racing_requests_never_pass_the_tokens_per_minute(m: Metered) -> None:
    body = {**CHAT, "max_tokens": 10}
    need = reserved(body)
    tpm = need * 10 + need // 2  # room for ten, and half of an eleventh
    m.keys.limit(tpm=tpm)
    answers = await race(m, body)
    assert Counter(status for status, _, _ in answers) == {200: 10, 429: RACERS - 10}
    assert len(m.engine.seen) == 10
    _, refusal, resp = next(a for a in answers if a[0] == 429)
    assert_error_shape(refusal, "rate_limit_exceeded")
    assert refusal["error"]["type"] == "tokens"
    assert f"Limit {tpm}, Used {need * 10}, Requested {need}" in refusal["error"]["message"]
    assert int(resp.headers["Retry-After"]) >= 1
    assert resp.headers["x-ratelimit-limit-tokens"] == str(tpm)
    assert resp.headers["x-ratelimit-remaining-tokens"] == str(tpm - need * 10)
    # Settled to what the engine said they used (its stream's 7 + 4 each), not what was
    # reserved.
    _, _, resp = await m.gw.post("/v1/chat/completions", body)
    used = STREAM_PROMPT_TOKENS + m.engine.chunks
    assert resp.headers["x-ratelimit-remaining-tokens"] == str(tpm - 10 * used - need)


async def test_racing_requests_never_pass_the_requests_per_minute(m: Metered) -> None:
    m.keys.limit(rpm=7)
    answers = await race(m, CHAT)
    assert Counter(status for status, _, _ in answers) == {200: 7, 429: RACERS - 7}
    _, refusal, resp = next(a for a in answers if a[0] == 429)
    assert (refusal["error"]["type"], refusal["error"]["code"]) == (
        "requests",
        "rate_limit_exceeded",
    )
    assert resp.headers["x-ratelimit-remaining-requests"] == "0"
    assert DURATION.match(resp.headers["x-ratelimit-reset-requests"])


async def test_racing_requests_never_overspend_a_token_budget(m: Metered) -> None:
    body = {**CHAT, "max_tokens": 10}
    need = reserved(body)
    m.keys.limit(budget_tokens=need * 10 + need // 2, budget_tokens_per="day")
    answers = await race(m, body)
    assert Counter(status for status, _, _ in answers) == {200: 10, 429: RACERS - 10}
    _, refusal, resp = next(a for a in answers if a[0] == 429)
    assert_error_shape(refusal, "insufficient_quota")
    assert refusal["error"]["type"] == "insufficient_quota"
    assert "this day" in refusal["error"]["message"]
    assert resp.headers["x-should-retry"] == "false" and int(resp.headers["Retry-After"]) >= 1
    assert (await m.usage())[MODEL].requests == 10
    assert (await m.gw.post("/v1/chat/completions", body))[0] == 200  # the rest settled free


async def test_racing_requests_never_overspend_a_spend_budget(m: Metered) -> None:
    body = {**CHAT, "max_tokens": 10}
    model = PricedModels().models[MODEL]
    most = cost(model, reserved(body) - 10, 10)
    m.keys.limit(budget_spend=from_pico(most * 4 + most // 2), budget_spend_per="month")
    answers = await race(m, body)
    assert Counter(status for status, _, _ in answers) == {200: 4, 429: RACERS - 4}
    _, refusal, _ = next(a for a in answers if a[0] == 429)
    assert refusal["error"]["code"] == "insufficient_quota"
    assert "this month" in refusal["error"]["message"]
    spent = cost(model, STREAM_PROMPT_TOKENS, m.engine.chunks)  # its stream's usage
    assert (await m.usage())[MODEL].spend_pico == 4 * spent


async def test_openai_client_sees_rate_limit_and_quota_errors(m: Metered) -> None:
    m.keys.limit(tpm=10)  # smaller than any request
    async with m.gw.openai() as client:
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES)
        assert caught.value.code == "rate_limit_exceeded"
        assert "Request too large" in caught.value.message
        assert caught.value.response.headers["x-should-retry"] == "false"
        m.keys.limit(budget_tokens=10)
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES)
        assert caught.value.code == "insufficient_quota"
    assert not m.engine.seen


# Headers.


async def test_successful_answers_carry_the_rate_limit_headers(m: Metered) -> None:
    m.keys.limit(rpm=5, tpm=100_000)
    async with m.gw.openai() as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=10
        )
        h = raw.headers
        assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("5", "4")
        assert h["x-ratelimit-limit-tokens"] == "100000"
        assert 100_000 - int(h["x-ratelimit-remaining-tokens"]) > 10  # prompt bound + max_tokens
        assert DURATION.match(h["x-ratelimit-reset-requests"])
        assert DURATION.match(h["x-ratelimit-reset-tokens"])
        stream = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, stream=True
        )
        assert stream.headers["x-ratelimit-remaining-requests"] == "3"
        async for _ in stream.parse():
            pass


async def test_keys_without_limits_get_no_rate_limit_headers(m: Metered) -> None:
    _, _, resp = await m.gw.post("/v1/chat/completions", CHAT)
    assert not [h for h in resp.headers if h.lower().startswith("x-ratelimit")]


# Usage.


async def test_usage_of_an_answer_is_what_the_engine_reported(m: Metered) -> None:
    async with m.gw.openai() as client:
        chat = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
        text = await client.completions.create(model=MODEL, prompt="Once")
    # A whole answer is asked of the engine as a stream and folded: its usage is the stream's.
    prompt, completion = STREAM_PROMPT_TOKENS, m.engine.chunks
    for answer in (chat, text):
        assert answer.usage is not None
        assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (prompt, completion)
    counts = (await m.usage())[MODEL]
    assert (counts.requests, counts.prompt_tokens, counts.completion_tokens) == (
        2,
        2 * prompt,
        2 * completion,
    )
    assert counts.spend_pico == 2 * cost(PricedModels().models[MODEL], prompt, completion)


async def test_stream_usage_is_asked_for_counted_and_not_shown_unasked(m: Metered) -> None:
    async with m.gw.openai() as client:
        stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
    assert m.engine.seen[0].body["stream_options"] == {"include_usage": True}
    assert len(chunks) == 4 and all(c.usage is None and c.choices for c in chunks)
    counts = (await m.usage())[MODEL]
    assert (counts.prompt_tokens, counts.completion_tokens) == (STREAM_PROMPT_TOKENS, 4)


async def test_stream_usage_chunk_is_passed_on_when_asked(m: Metered) -> None:
    async with m.gw.openai() as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert len(chunks) == 5
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (STREAM_PROMPT_TOKENS, 4)
    assert (await m.usage())[MODEL].completion_tokens == 4


@pytest.mark.parametrize("asked", [False, True])
async def test_completions_stream_keeps_its_last_text_and_its_framing(
    m: Metered, asked: bool
) -> None:
    body: dict[str, Any] = {"model": MODEL, "prompt": "Once", "stream": True}
    if asked:
        body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {USER_SECRET}"}
    async with m.gw.http.post(f"{m.gw.url}/v1/completions", json=body, headers=headers) as resp:
        text = (await resp.read()).decode()
    events = text.split("\n\n")
    assert events.pop() == ""  # ends with a complete event
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == ["t0 ", "t1 ", "t2 ", "t3 "]
    assert ("usage" in chunks[-1]) is asked
    assert not any("usage" in c for c in chunks[:-1])
    assert (await m.usage())[MODEL].completion_tokens == 4


async def test_a_stream_the_client_left_still_counts(m: Metered) -> None:
    m.engine.hang_after_first = True
    body = {**CHAT, "stream": True, "max_tokens": 50}
    raw = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {USER_SECRET}"}
    resp = await m.gw.http.post(f"{m.gw.url}/v1/chat/completions", data=raw, headers=headers)
    assert b"t0" in await resp.content.readany()
    resp.close()
    await asyncio.wait_for(m.engine.cancelled.wait(), timeout=5)
    for _ in range(1000):  # settled once the proxy saw the client go
        if await m.usage():
            break
        await asyncio.sleep(0.01)
    counts = (await m.usage())[MODEL]
    # No usage came: the prompt's bound, and one token for the one chunk relayed.
    assert (counts.prompt_tokens, counts.completion_tokens) == (len(raw), 1)


async def test_refused_and_failed_requests_are_not_counted(m: Metered) -> None:
    m.keys.limit(tpm=100_000)
    engine_refused = {**CHAT, "model": FREE, "max_tokens": 4242}  # the fake engine says 400
    assert (await m.gw.post("/v1/chat/completions", engine_refused))[0] == 400
    router_refused = {**CHAT, "max_tokens": MAX_TOKENS + 1}
    assert (await m.gw.post("/v1/chat/completions", router_refused))[0] == 400
    status, _, resp = await m.gw.post("/v1/chat/completions", CHAT)
    assert status == 200
    assert {model: c.requests for model, c in (await m.usage()).items()} == {MODEL: 1}
    # The engine's refusal gave its reservation back whole.
    assert resp.headers["x-ratelimit-remaining-tokens"] == str(100_000 - reserved(CHAT))


# The model's limits.


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
async def test_asking_more_than_the_models_limit_is_refused(m: Metered, param: str) -> None:
    status, answer, _ = await m.gw.post("/v1/chat/completions", {**CHAT, param: MAX_TOKENS + 1})
    assert status == 400
    assert_error_shape(answer, "invalid_value", param)
    assert f"at most {MAX_TOKENS} completion tokens" in answer["error"]["message"]
    assert not m.engine.seen


async def test_the_models_limit_goes_to_the_engine(m: Metered) -> None:
    await m.gw.post("/v1/chat/completions", CHAT)
    await m.gw.post("/v1/chat/completions", {**CHAT, "max_completion_tokens": 30})
    first, second = (s.body for s in m.engine.seen)
    assert first["max_tokens"] == MAX_TOKENS
    assert (second["max_tokens"], second["max_completion_tokens"]) == (30, 30)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "w " * 51}]},
            "messages",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "w " * 51}]}]},
            "messages",
        ),
        ("/v1/completions", {"prompt": list(range(51))}, "prompt"),
        ("/v1/completions", {"prompt": ["short", "w " * 51]}, "prompt"),
    ],
)
async def test_a_prompt_longer_than_the_context_is_refused(
    m: Metered, path: str, body: dict[str, Any], param: str
) -> None:
    status, answer, _ = await m.gw.post(path, {"model": TINY, **body})
    assert status == 400
    assert_error_shape(answer, "context_length_exceeded", param)
    assert "maximum context length is 50 tokens" in answer["error"]["message"]
    assert not m.engine.seen


async def test_a_prompt_that_may_fit_goes_on(m: Metered) -> None:
    # 400 bytes, over the context of 50 if a token were a byte, but only one word: it may fit,
    # and the engine judges.
    body = {"model": TINY, "messages": [{"role": "user", "content": "x" * 400}]}
    status, _, _ = await m.gw.post("/v1/chat/completions", body)
    assert status == 200 and len(m.engine.seen) == 1


def test_reservation_bounds_every_choice() -> None:
    from llmgwd.router.token_bounds import estimate

    model = PricedModels().models[MODEL]
    doc: dict[str, Any] = {"model": MODEL, "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 10}
    assert estimate(doc, model, 99) == Estimate(prompt=99, completion=60, requests=3)
