"""/v1/messages/count_tokens is held to the key's tokens per minute (issue 26, finding 7): the
engine reads the whole prompt to count it (a 3.9 MB body was 780k tokens, about a second of
the engine's CPU), so the prompt's bound is reserved as a completion request's is, and a
prompt larger than the limit is refused before any engine sees it. Counting is not billed."""

from __future__ import annotations

import time

import anthropic
import pytest

from llmgwd.accounting.periods import Today
from tests.llmgwd.router import test_router_routes as routes
from tests.llmgwd.router.test_router_metering import Metered
from tests.llmgwd.router.test_router_routes import MESSAGES, claude, counted
from tests.llmgwd.router.test_router_v1 import MODEL

m = routes.m  # its fixture, for the tests here

TPM = 3000


async def test_a_count_larger_than_the_tokens_per_minute_is_refused_before_the_engine(
    m: Metered,
) -> None:
    m.keys.limit(tpm=TPM)
    big: list[anthropic.types.MessageParam] = [{"role": "user", "content": "word " * 2000}]
    async with claude(m) as client:
        with pytest.raises(anthropic.RateLimitError) as caught:
            await client.messages.count_tokens(model=MODEL, messages=big)
    body = caught.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "rate_limit_error"
    assert "tokens per min (TPM)" in body["error"]["message"]
    assert m.engine.seen == []


async def test_a_count_shows_its_prompt_held_against_the_tokens_per_minute(m: Metered) -> None:
    m.keys.limit(tpm=TPM)
    async with claude(m) as client:
        raw = await client.messages.with_raw_response.count_tokens(model=MODEL, messages=MESSAGES)
    assert (await raw.parse()).input_tokens == 32
    assert raw.headers["x-ratelimit-limit-tokens"] == str(TPM)
    remaining = int(raw.headers["x-ratelimit-remaining-tokens"])
    assert TPM - 200 < remaining < TPM  # the body's bytes, about 80, held while it is counted
    assert await counted(m) == (1, 0, 0)  # one request, no token billed


async def test_a_count_spends_no_budget_and_its_tokens_count_against_the_rate(m: Metered) -> None:
    """A key whose token budget is nearly spent may still count (Anthropic bills no count),
    and the engine's count (32 tokens), not the body's bound, stays in its tokens per minute."""
    m.keys.limit(tpm=TPM, budget_tokens=10, budget_tokens_per="day")
    async with claude(m) as client:
        await client.messages.count_tokens(model=MODEL, messages=MESSAGES)
        raw = await client.messages.with_raw_response.count_tokens(model=MODEL, messages=MESSAGES)
    assert (await raw.parse()).input_tokens == 32
    assert await counted(m) == (2, 0, 0)
    assert m.meter.budgets.used("key-user", Today().at(time.time())) == (0, 0)
    assert m.meter.budgets.reserved("key-user") == (0, 0)
    window = m.meter.limits.states("key-user", m.keys.key.limits, time.monotonic())
    assert [s.remaining for s in window if s.kind == "tokens"] == [TPM - 2 * 32]
