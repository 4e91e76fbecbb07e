"""A model the catalog gives no context is bounded by its ready replicas' (issue 9, finding
10): the largest of them refuses a longer prompt or max_tokens before any engine sees it, and
is written as max_tokens when the request sets none (a prompt only some replicas hold goes to
one of those: test_router_context_roll.py); 4096 only when no context is known."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from llmgwd.router.token_bounds import UNBOUNDED_COMPLETION
from tests.llmgwd.router import test_router_metering as metering
from tests.llmgwd.router import test_router_v1 as v1
from tests.llmgwd.router.test_router_fields import CHAT_PATH, COMPLETIONS, EMBEDDINGS, refused
from tests.llmgwd.router.test_router_metering import FREE, TINY, Metered
from tests.llmgwd.router.test_router_v1 import CHAT, endpoint

engine, m = v1.engine, metering.m  # their fixtures, for the tests here

WORDS_3000 = "word " * 3000  # at least 3,000 tokens in any vocabulary


def place(m: Metered, *contexts: int) -> None:
    """FREE (no context in the catalog) served by one ready replica per context given."""
    m.gw.pool.endpoints[FREE] = [
        replace(endpoint(m.engine.url, f"r{i}"), context=c) for i, c in enumerate(contexts)
    ]


async def test_max_tokens_over_the_replicas_context_is_refused(m: Metered) -> None:
    place(m, 2048)
    body = {**CHAT, "model": FREE, "max_tokens": 5000}
    answer = await refused(m.gw, CHAT_PATH, body, "invalid_value", "max_tokens")
    assert "at most 2048 completion tokens" in answer["error"]["message"]


async def test_without_max_tokens_the_engine_gets_the_largest_replica_context(
    m: Metered,
) -> None:
    place(m, 8192, 2048, 0)  # an answer is cut by its own engine's context only
    status, _, _ = await m.gw.post(CHAT_PATH, {**CHAT, "model": FREE})
    assert status == 200
    assert m.engine.seen[0].body["max_tokens"] == 8192


async def test_an_answer_of_a_replica_placed_longer_than_4096_is_not_cut_at_4096(
    m: Metered,
) -> None:
    place(m, 8192)
    assert (await m.gw.post(CHAT_PATH, {**CHAT, "model": FREE}))[0] == 200
    assert (await m.gw.post(CHAT_PATH, {**CHAT, "model": FREE, "max_tokens": 6000}))[0] == 200
    assert [s.body["max_tokens"] for s in m.engine.seen] == [8192, 6000]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT_PATH, {"messages": [{"role": "user", "content": WORDS_3000}]}, "messages"),
        (COMPLETIONS, {"prompt": WORDS_3000}, "prompt"),
        (EMBEDDINGS, {"input": WORDS_3000}, "input"),
    ],
)
async def test_a_prompt_longer_than_the_replicas_context_never_reaches_an_engine(
    m: Metered, path: str, body: dict[str, Any], param: str
) -> None:
    place(m, 2048)
    answer = await refused(m.gw, path, {"model": FREE, **body}, "context_length_exceeded", param)
    assert "maximum context length is 2048 tokens" in answer["error"]["message"]


async def test_with_no_context_known_anywhere_4096_is_written_as_before(m: Metered) -> None:
    place(m, 0)
    assert (await m.gw.post(CHAT_PATH, {**CHAT, "model": FREE}))[0] == 200
    assert (await m.gw.post(COMPLETIONS, {"model": FREE, "prompt": WORDS_3000}))[0] == 200
    assert [s.body["max_tokens"] for s in m.engine.seen] == [UNBOUNDED_COMPLETION] * 2
    assert UNBOUNDED_COMPLETION == 4096


async def test_the_catalogs_context_comes_before_the_replicas(m: Metered) -> None:
    m.gw.pool.endpoints[TINY] = [replace(endpoint(m.engine.url), context=2048)]
    assert (await m.gw.post(CHAT_PATH, {**CHAT, "model": TINY}))[0] == 200
    assert m.engine.seen[0].body["max_tokens"] == 50  # TINY's context in the catalog
