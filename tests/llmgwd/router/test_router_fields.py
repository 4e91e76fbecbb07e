"""What reaches an engine (issue 9): only each route's allowed fields, in their ranges, with the
completion bound the router reserved; a prompt list counts as that many requests."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from llmgwd.router.token_bounds import UNBOUNDED_COMPLETION
from tests.llmgwd.router import test_router_metering as metering
from tests.llmgwd.router import test_router_v1 as v1
from tests.llmgwd.router.test_router_metering import FREE, TINY, Metered
from tests.llmgwd.router.test_router_v1 import CHAT, MODEL, Gateway, assert_error_shape

engine, gw, m = v1.engine, v1.gw, metering.m  # their fixtures, for the tests here

CHAT_PATH, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
# llama.cpp's own fields: how much is generated, which slot, what of its internals comes back.
ENGINE_FIELDS = {
    "n_predict": -1,
    "ignore_eos": True,
    "id_slot": 0,
    "t_max_predict_ms": 600_000,
    "cache_prompt": False,
    "n_probs": 100_000,
    "n_keep": -1,
    "samplers": ["top_k"],
    "post_sampling_probs": True,
    "timings_per_token": True,
    "chat_template_kwargs": {"enable_thinking": True},
}


async def refused(
    gw: Gateway, path: str, body: dict[str, Any], code: str, param: str
) -> dict[str, Any]:
    """Post body: it must get a 400 in OpenAI's shape naming param, and reach no engine."""
    status, answer, _ = await gw.post(path, body)
    assert status == 400, answer
    assert_error_shape(answer, code, param)
    assert answer["error"]["type"] == "invalid_request_error"
    assert not gw.engine.seen
    return answer


# Finding 2: engine fields never pass; the engine gets the bound that was reserved.


@pytest.mark.parametrize(("field", "value"), ENGINE_FIELDS.items())
@pytest.mark.parametrize("path", [CHAT_PATH, COMPLETIONS])
async def test_engine_fields_are_refused(gw: Gateway, path: str, field: str, value: Any) -> None:
    base = CHAT if path == CHAT_PATH else {"model": MODEL, "prompt": "Once"}
    answer = await refused(gw, path, {**base, field: value}, "unknown_parameter", field)
    assert answer["error"]["message"] == f"Unrecognized request argument supplied: {field}"


async def test_an_unknown_field_through_the_official_client_is_a_bad_request(gw: Gateway) -> None:
    async with gw.openai() as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body={"foo": 1}
            )
    assert (caught.value.param, caught.value.code) == ("foo", "unknown_parameter")
    assert not gw.engine.seen


@pytest.mark.parametrize(("model", "bound"), [(FREE, UNBOUNDED_COMPLETION), (TINY, 50)])
async def test_a_request_without_max_tokens_reaches_the_engine_with_the_bound_reserved(
    m: Metered, model: str, bound: int
) -> None:
    status, _, _ = await m.gw.post(CHAT_PATH, {**CHAT, "model": model})
    assert status == 200
    assert m.engine.seen[0].body["max_tokens"] == bound


async def test_a_token_budget_cannot_be_passed_with_engine_fields(m: Metered) -> None:
    m.keys.limit(budget_tokens=3000, budget_tokens_per="day")
    free = {**CHAT, "model": FREE}
    for extra in ({"n_predict": 5000}, {"n_predict": -1, "ignore_eos": True}, {"n_cmpl": 4}):
        status, answer, _ = await m.gw.post(CHAT_PATH, {**free, "max_tokens": 10, **extra})
        assert status == 400 and answer["error"]["code"] == "unknown_parameter"
    # No max_tokens: the default bound is reserved (too much for this budget), and written.
    status, answer, _ = await m.gw.post(CHAT_PATH, free)
    assert status == 429 and answer["error"]["code"] == "insufficient_quota"
    assert (await m.gw.post(CHAT_PATH, {**free, "max_tokens": 1000}))[0] == 200
    (seen,) = m.engine.seen
    assert seen.body["max_tokens"] == 1000
    # Of llama-server's own fields, only the slot the router chose (router/isolation.py).
    assert not set(seen.body) & ({*ENGINE_FIELDS, "n_cmpl"} - {"id_slot", "cache_prompt"})


# Finding 1: what multiplies the engine's work or the answer's size is bounded.


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        (CHAT_PATH, {"logprobs": True, "top_logprobs": 100_000}, "top_logprobs"),
        (CHAT_PATH, {"top_logprobs": 5}, "top_logprobs"),  # without logprobs
        (CHAT_PATH, {"n": 1000}, "n"),
        (CHAT_PATH, {"logit_bias": {str(i): 1 for i in range(1000)}}, "logit_bias"),
        (CHAT_PATH, {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        (COMPLETIONS, {"logprobs": 100_000}, "logprobs"),
        (COMPLETIONS, {"n": 17}, "n"),
    ],
)
async def test_fields_that_multiply_the_work_are_bounded(
    gw: Gateway, path: str, extra: dict[str, Any], param: str
) -> None:
    base = CHAT if path == CHAT_PATH else {"model": MODEL, "prompt": "Once"}
    await refused(gw, path, {**base, **extra}, "invalid_value", param)


# Finding 10: numbers are checked before anything is sent.


async def test_max_tokens_past_int32_is_refused_without_a_context(m: Metered) -> None:
    await refused(
        m.gw,
        CHAT_PATH,
        {**CHAT, "model": FREE, "max_tokens": 10**12},
        "invalid_value",
        "max_tokens",
    )


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT_PATH, {"messages": [{"role": "user", "content": "x" * 60_000}]}, "messages"),
        (COMPLETIONS, {"prompt": "x" * 60_000}, "prompt"),
        (EMBEDDINGS, {"input": "x" * 60_000}, "input"),
    ],
)
async def test_a_huge_prompt_is_refused_before_the_engine_tokenizes_it(
    m: Metered, path: str, body: dict[str, Any], param: str
) -> None:
    # One word of 60,000 characters: more tokens than TINY's context of 50 whatever the vocabulary.
    await refused(m.gw, path, {"model": TINY, **body}, "context_length_exceeded", param)


# Finding 11: a prompt list is bounded, and counts as that many requests.


async def test_a_list_of_500_prompts_is_refused(gw: Gateway) -> None:
    body = {"model": MODEL, "prompt": ["Once"] * 500}
    answer = await refused(gw, COMPLETIONS, body, "invalid_value", "prompt")
    assert "500 prompts" in answer["error"]["message"]


async def test_prompts_times_n_are_bounded(gw: Gateway) -> None:
    await refused(
        gw, COMPLETIONS, {"model": MODEL, "prompt": ["a"] * 4, "n": 5}, "invalid_value", "n"
    )


async def test_each_prompt_of_a_list_counts_as_a_request(m: Metered) -> None:
    m.keys.limit(rpm=7)
    body = {"model": MODEL, "prompt": ["Once"] * 5, "max_tokens": 5}
    status, _, resp = await m.gw.post(COMPLETIONS, body)
    assert status == 200
    assert resp.headers["x-ratelimit-remaining-requests"] == "2"
    status, answer, _ = await m.gw.post(COMPLETIONS, body)
    assert (status, answer["error"]["type"]) == (429, "requests")
    assert len(m.engine.seen) == 1


# Finding 9, the request half: a client's mistake is a 400 naming the param, from the router.


@pytest.mark.parametrize(
    ("extra", "code", "param"),
    [
        ({"tools": "x"}, "invalid_type", "tools"),
        ({"tools": [{"type": "code"}]}, "invalid_value", "tools[0].type"),
        (
            {"tools": [{"type": "function", "function": {}}]},
            "missing_required_parameter",
            "tools[0].function.name",
        ),
        ({"messages": [{"content": "hi"}]}, "missing_required_parameter", "messages[0].role"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "invalid_value", "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "missing_required_parameter", "messages[0].content"),
        ({"messages": [{"role": "user", "content": 5}]}, "invalid_type", "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "x", "text": "hi"}]}]},
            "invalid_value",
            "messages[0].content[0].type",
        ),
        ({"tool_choice": "sometimes"}, "invalid_value", "tool_choice"),
        ({"response_format": {"type": "yaml"}}, "invalid_value", "response_format.type"),
        (
            {"stream_options": {"include_usage": "yes"}},
            "invalid_type",
            "stream_options.include_usage",
        ),
        ({"temperature": 7}, "invalid_value", "temperature"),
        ({"audio": {"voice": "alloy"}}, "unsupported_parameter", "audio"),
    ],
)
async def test_client_mistakes_get_400_naming_the_param(
    gw: Gateway, extra: dict[str, Any], code: str, param: str
) -> None:
    await refused(gw, CHAT_PATH, {**CHAT, **extra}, code, param)


async def test_the_official_client_sees_the_param_of_a_role_less_message(gw: Gateway) -> None:
    async with gw.openai() as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model=MODEL, messages=[{"content": "hi"}])  # type: ignore[list-item]
    assert caught.value.param == "messages[0].role"


async def test_what_the_engine_lacks_is_refused_naming_the_model(gw: Gateway) -> None:
    body = {"model": MODEL, "prompt": "Once", "best_of": 3}
    answer = await refused(gw, COMPLETIONS, body, "unsupported_parameter", "best_of")
    assert f"'{MODEL}' runs on llama.cpp" in answer["error"]["message"]
    status, _, _ = await gw.post(COMPLETIONS, {"model": MODEL, "prompt": "Once", "echo": False})
    assert status == 200 and "echo" not in gw.engine.seen[0].body  # a default: dropped


async def test_openai_fields_and_safe_sampling_extras_pass(gw: Gateway) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    extra = {
        "top_k": 40,
        "min_p": 0.05,
        "repeat_penalty": 1.1,
        "seed": 7,
        "stop": ["\n"],
        "logprobs": True,
        "top_logprobs": 20,
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "response_format": {"type": "json_object"},
        "user": "u",
    }
    # An assistant message resent as the openai client parsed it, with its null fields.
    said = {"role": "assistant", "content": "hello", "refusal": None, "tool_calls": None}
    messages = [*CHAT["messages"], said, {"role": "user", "content": "more"}]
    status, _, _ = await gw.post(CHAT_PATH, {**CHAT, "messages": messages, **extra})
    assert status == 200
    assert {k: gw.engine.seen[0].body[k] for k in extra} == extra


# Images by URL: the engine would fetch them from the node, so only inline data: URLs pass.


@pytest.mark.parametrize("url", ["http://10.0.0.1:9090/metrics", "https://example.com/cat.png"])
async def test_an_image_by_url_is_refused(gw: Gateway, url: str) -> None:
    image = {"url": url}
    parts = [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": image}]
    body = {**CHAT, "messages": [{"role": "user", "content": parts}]}
    param = "messages[0].content[1].image_url.url"
    answer = await refused(gw, CHAT_PATH, body, "invalid_value", param)
    assert "inline as data: URLs" in answer["error"]["message"]


async def test_an_inline_image_passes(gw: Gateway) -> None:
    image = {"url": "data:image/png;base64,iVBORw0KGgo="}
    parts = [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": image}]
    body = {**CHAT, "messages": [{"role": "user", "content": parts}]}
    status, _, _ = await gw.post(CHAT_PATH, body)
    assert status == 200
    assert gw.engine.seen[0].body["messages"][0]["content"][1]["image_url"] == image
