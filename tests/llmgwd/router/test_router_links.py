"""Content given by a link never reaches an engine (issue 26, finding 6): llama-server fetches
an image URL from the node it runs on, so a request body would choose where the cluster
connects. Every route takes an allow-list of content part and source types, and only inline
data (base64, data: URLs) passes; a link or a stored file's id is a 400 in the route's shape."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from tests.llmgwd.router import test_router_routes as routes
from tests.llmgwd.router import test_router_v1 as v1
from tests.llmgwd.router.test_router_metering import Metered
from tests.llmgwd.router.test_router_routes import MESSAGES, claude
from tests.llmgwd.router.test_router_v1 import CHAT, MODEL, Gateway, assert_error_shape

m, engine, gw = routes.m, v1.engine, v1.gw  # their fixtures, for the tests here

LINK = "http://10.0.0.1:9090/metrics"  # a node-side address a client should never reach
PNG = "iVBORw0KGgo="  # base64 of a PNG's first bytes
URL_IMAGE = {"type": "image", "source": {"type": "url", "url": LINK}}
FILE_IMAGE = {"type": "image", "source": {"type": "file", "file_id": "file_1"}}
B64_IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}


def _user(*blocks: dict[str, Any]) -> list[Any]:
    return [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, *blocks]}]


# Anthropic's Messages: image sources of type url or file, anywhere in a message.


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (_user(URL_IMAGE), "messages[0].content[1].source.url"),
        (_user(FILE_IMAGE), "messages[0].content[1].source.file_id"),
        (
            _user({"type": "tool_result", "tool_use_id": "t1", "content": [URL_IMAGE]}),
            "messages[0].content[1].content[0].source.url",
        ),
        (
            _user({"type": "document", "source": {"type": "url", "url": LINK}}),
            "messages[0].content[1].type",
        ),
        (_user({"type": "image_url", "image_url": {"url": LINK}}), "messages[0].content[1].type"),
    ],
)
@pytest.mark.parametrize("count", [False, True])
async def test_messages_refuse_content_by_link(
    m: Metered, messages: list[Any], param: str, count: bool
) -> None:
    async with claude(m) as client:
        with pytest.raises(anthropic.BadRequestError) as caught:
            if count:
                await client.messages.count_tokens(model=MODEL, messages=messages)
            else:
                await client.messages.create(model=MODEL, messages=messages, max_tokens=8)
    body: Any = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert f"'{param}'" in body["error"]["message"]
    assert m.engine.seen == []


async def test_messages_take_an_inline_image(m: Metered) -> None:
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [B64_IMAGE]}
    async with claude(m) as client:
        await client.messages.create(model=MODEL, messages=_user(B64_IMAGE), max_tokens=8)
        await client.messages.count_tokens(model=MODEL, messages=_user(result))
    assert m.engine.seen[0].body["messages"][0]["content"][1] == B64_IMAGE
    assert len(m.engine.seen) == 2


async def test_messages_still_take_plain_text(m: Metered) -> None:
    async with claude(m) as client:
        await client.messages.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, system=[{"type": "text", "text": "Be"}]
        )
    assert len(m.engine.seen) == 1


# OpenAI's Responses: input_image and input_file by link or file id, in messages and in a
# function call's output.


def _input(*parts: dict[str, Any]) -> list[Any]:
    return [{"role": "user", "content": [{"type": "input_text", "text": "what is it?"}, *parts]}]


@pytest.mark.parametrize(
    ("items", "param"),
    [
        (_input({"type": "input_image", "image_url": LINK}), "input[0].content[1].image_url"),
        (
            _input({"type": "input_image", "file_id": "file_1", "detail": "auto"}),
            "input[0].content[1].file_id",
        ),
        (_input({"type": "input_file", "file_url": LINK}), "input[0].content[1].file_url"),
        (_input({"type": "input_file", "file_id": "file_1"}), "input[0].content[1].file_id"),
        (
            _input({"type": "input_file", "file_data": LINK, "filename": "a.pdf"}),
            "input[0].content[1].file_data",
        ),
        (_input({"type": "input_audio", "url": LINK}), "input[0].content[1].type"),
        (
            [
                {"type": "function_call_output", "call_id": "c1",
                 "output": [{"type": "input_image", "image_url": LINK}]},
            ],
            "input[0].output[0].image_url",
        ),
        ([{"type": "image_generation_call", "id": "ig1", "result": LINK}], "input[0].type"),
    ],
)  # fmt: skip
async def test_responses_refuse_content_by_link(m: Metered, items: list[Any], param: str) -> None:
    async with m.gw.openai() as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model=MODEL, input=items)
    assert caught.value.param == param
    assert caught.value.code in ("invalid_value", "unknown_parameter")
    assert m.engine.seen == []


async def test_responses_take_inline_images_and_typeless_messages(m: Metered) -> None:
    image = {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"}
    items = [*_input(image), {"role": "assistant", "content": "a cat"}]
    async with m.gw.openai() as client:
        await client.responses.create(model=MODEL, input=items)
    sent = m.engine.seen[0].body["input"]
    assert sent[0]["content"][1] == image
    assert sent[1] == {"role": "assistant", "content": "a cat", "type": "message"}


# OpenAI's chat: audio is base64 data, never a link (llama.cpp reads input_audio.url, and
# fetches data that starts with "http").


@pytest.mark.parametrize(
    ("audio", "param", "code"),
    [
        ({"data": LINK, "format": "wav"}, "messages[0].content[1].input_audio.data",
         "invalid_value"),
        ({"data": "http", "format": "wav"}, "messages[0].content[1].input_audio.data",
         "invalid_value"),
        ({"url": LINK, "data": "UklGRg==", "format": "wav"},
         "messages[0].content[1].input_audio.url", "unknown_parameter"),
    ],
)  # fmt: skip
async def test_chat_refuses_audio_by_link(
    gw: Gateway, audio: dict[str, str], param: str, code: str
) -> None:
    parts = [{"type": "text", "text": "what is it?"}, {"type": "input_audio", "input_audio": audio}]
    body = {**CHAT, "messages": [{"role": "user", "content": parts}]}
    status, answer, _ = await gw.post("/v1/chat/completions", body)
    assert status == 400
    assert_error_shape(answer, code, param)
    assert not gw.engine.seen


async def test_chat_takes_inline_audio(gw: Gateway) -> None:
    audio = {"data": "UklGRiQAAABXQVZF\nZm10IBAAAAAB", "format": "wav"}
    parts = [{"type": "text", "text": "what is it?"}, {"type": "input_audio", "input_audio": audio}]
    status, _, _ = await gw.post(
        "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": parts}]}
    )
    assert status == 200
    assert gw.engine.seen[0].body["messages"][0]["content"][1]["input_audio"] == audio
