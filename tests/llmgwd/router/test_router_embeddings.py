"""POST /v1/embeddings through the router, with the openai client and test_router_v1's engine."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from llmgwd.accounting.usage import Counts
from tests.llmgwd.router import test_router_metering as metering
from tests.llmgwd.router import test_router_v1 as v1
from tests.llmgwd.router.test_router_v1 import (
    EMBED_TOKENS,
    EMBEDDING,
    ENGINE_KEY,
    MODEL,
    USER_SECRET,
    Gateway,
    assert_error_shape,
)

engine, gw, m = v1.engine, v1.gw, metering.m  # their fixtures, for the tests here

PATH = "/v1/embeddings"


async def test_embeddings_through_the_official_client(gw: Gateway) -> None:
    async with gw.openai() as client:
        answer = await client.embeddings.create(model=MODEL, input=["one", "two"])
    assert [d.embedding for d in answer.data] == [[0.0, *EMBEDDING], [1.0, *EMBEDDING]]
    assert [d.index for d in answer.data] == [0, 1]
    assert answer.usage.prompt_tokens == 2 * EMBED_TOKENS
    (seen,) = gw.engine.seen
    assert seen.path == PATH
    assert seen.body["input"] == ["one", "two"] and seen.body["model"] == MODEL
    assert seen.headers["Authorization"] == f"Bearer {ENGINE_KEY}"
    assert not any(USER_SECRET in v for v in seen.headers.values())


async def test_embeddings_as_floats_of_one_text(gw: Gateway) -> None:
    async with gw.openai() as client:
        answer = await client.embeddings.create(model=MODEL, input="one", encoding_format="float")
    assert [d.embedding for d in answer.data] == [[0.0, *EMBEDDING]]
    assert gw.engine.seen[0].body["encoding_format"] == "float"


async def test_embeddings_count_their_prompt_tokens(gw: Gateway) -> None:
    async with gw.openai() as client:
        await client.embeddings.create(model=MODEL, input=["one", "two", "three"])
    records = await gw.router.meter.usage.records("")
    assert [(r.model, r.counts) for r in records] == [
        (MODEL, Counts(requests=1, prompt_tokens=3 * EMBED_TOKENS, completion_tokens=0))
    ]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": "x"}, "model", "missing_required_parameter"),
        ({"model": 7, "input": "x"}, "model", "invalid_type"),
        ({"model": MODEL}, "input", "missing_required_parameter"),
        ({"model": MODEL, "input": 5}, "input", "invalid_type"),
        ({"model": MODEL, "input": []}, "input", "invalid_value"),
        ({"model": MODEL, "input": ["a", None]}, "input[1]", "invalid_type"),
        ({"model": MODEL, "input": [[1, "a"]]}, "input[0]", "invalid_type"),
        ({"model": MODEL, "input": ["a", 1]}, "input[1]", "invalid_value"),
        ({"model": MODEL, "input": "x", "stream": True}, "stream", "invalid_value"),
    ],
)
async def test_bad_embedding_bodies_get_400_naming_the_field(
    gw: Gateway, body: dict[str, Any], param: str, code: str
) -> None:
    status, answer, _ = await gw.post(PATH, body)
    assert status == 400
    assert_error_shape(answer, code, param)
    assert not gw.engine.seen


@pytest.mark.parametrize("value", [[1, 2, 3], [[1, 2], [3]], ["a", "b"]])
async def test_token_ids_and_texts_are_all_inputs(gw: Gateway, value: list[Any]) -> None:
    status, _, _ = await gw.post(PATH, {"model": MODEL, "input": value})
    assert status == 200
    assert gw.engine.seen[0].body["input"] == value


async def test_embeddings_need_a_key(gw: Gateway) -> None:
    status, answer, _ = await gw.post(PATH, {"model": MODEL, "input": "x"}, key=None)
    assert status == 401
    assert_error_shape(answer, "invalid_api_key")


async def test_embeddings_on_a_model_without_them_say_which_model_lacks_what(
    gw: Gateway,
) -> None:
    gw.engine.embeddings = False  # llama-server without --embeddings: 501 "Start it with ..."
    status, answer, _ = await gw.post(PATH, {"model": MODEL, "input": "one"})
    assert status == 400
    assert_error_shape(answer, "model_not_supported", "model")
    assert answer["error"]["message"] == f"The model '{MODEL}' does not support embeddings."
    async with gw.openai() as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.embeddings.create(model=MODEL, input="one")
    assert "--embeddings" not in caught.value.message and "Start it" not in caught.value.message


async def test_embeddings_are_held_to_the_keys_rate_limit(m: metering.Metered) -> None:
    m.keys.limit(rpm=1)
    first, _, resp = await m.gw.post(PATH, {"model": MODEL, "input": "x"})
    second, answer, _ = await m.gw.post(PATH, {"model": MODEL, "input": "x"})
    assert (first, second) == (200, 429)
    assert resp.headers["x-ratelimit-remaining-requests"] == "0"
    assert answer["error"]["code"] == "rate_limit_exceeded"
    assert len(m.engine.seen) == 1


async def test_each_text_of_an_input_list_counts_as_a_request(m: metering.Metered) -> None:
    m.keys.limit(rpm=5)
    first, _, resp = await m.gw.post(PATH, {"model": MODEL, "input": ["a", "b", "c"]})
    assert first == 200 and resp.headers["x-ratelimit-remaining-requests"] == "2"
    tokens, _, resp = await m.gw.post(PATH, {"model": MODEL, "input": [1, 2, 3]})  # one text
    assert tokens == 200 and resp.headers["x-ratelimit-remaining-requests"] == "1"
    second, answer, _ = await m.gw.post(PATH, {"model": MODEL, "input": [[1], [2]]})
    assert (second, answer["error"]["code"]) == (429, "rate_limit_exceeded")
    assert len(m.engine.seen) == 2
