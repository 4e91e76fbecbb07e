"""No engine wording reaches a client (issue 26, finding 13): an engine's refusal is told in the
router's own words, from an allow-list of the engine's known messages (router/engine_refusals.py),
with the field it concerns; any other text is the router's generic refusal or failure. Whole
answers and the error events of streams alike, on every route, in the route's own shape.

The engine's words are llama-server's own, recorded from the build scripts/build-llama-server
makes (llama_answers/refusals.json; llama_answers/README.md says how)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd.router import Router
from tests.llmgwd.router.test_router_v1 import (
    CHAT,
    MODEL,
    USER_SECRET,
    FakeKeys,
    FakeModels,
    FakePool,
    endpoint,
    serve,
)

ANSWERS = Path(__file__).parent / "llama_answers"
RECORDED: dict[str, Any] = json.loads((ANSWERS / "refusals.json").read_text())
HI: list[Any] = [{"role": "user", "content": "hi"}]
BODIES: dict[str, dict[str, Any]] = {  # a request each route passes on
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"model": MODEL, "prompt": "hi"},
    "/v1/responses": {"model": MODEL, "input": "hi"},
    "/v1/messages": {"model": MODEL, "messages": HI, "max_tokens": 8},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": HI},
}
# Words of the engine's that must never reach a client: its name, hints, flags, library tags,
# and what its grammar and template code say.
ENGINE_WORDS = ("llamacpp", "llama", "hint", "mmproj", "--", "json.exception", "parser",
                "template", "try increasing", "definitions not found", "$ref #", "Field '",
                "Failed to parse", "Cannot determine", "CUDA")  # fmt: skip
REF = ("A '$ref' in the JSON schema does not resolve: only references into the same schema "
       "('#/...'), to parts it defines, are supported.")  # fmt: skip
TOOLS = ("'tools' could not be read: each tool must be {\"type\": \"function\", \"function\": "
         '{"name": ..., "parameters": {...}}}.')  # fmt: skip


def lacks(what: str) -> str:
    return f"The model '{MODEL}' does not support {what}."


def context(param: str) -> str:
    return (f"This model's maximum context length is 2048 tokens, but the prompt has at least "
            f"3031 tokens. Please reduce the length of the {param}.")  # fmt: skip


# recorded refusal -> (status, code, param, what the client is told); code and param are None
# on Anthropic's routes, whose errors carry neither.
TOLD: dict[str, tuple[int, str | None, str | None, str]] = {
    "responses_input_file": (400, "model_not_supported", "model", lacks("file input")),
    "chat_schema_bad_ref": (400, "invalid_request", "response_format", REF),
    "chat_schema_remote_ref": (400, "invalid_request", "response_format", REF),
    "completions_schema_bad_ref": (400, "invalid_request", None, REF),
    "chat_tools_string": (400, "invalid_request", "tools", TOOLS),
    "chat_tools_no_name": (400, "invalid_request", "tools", TOOLS),
    "chat_message_no_role": (400, "invalid_request", "messages",
                             "'messages' could not be read: each message must have a role and "
                             "content."),
    "chat_image_text_model": (400, "model_not_supported", "model", lacks("image input")),
    "chat_audio_text_model": (400, "model_not_supported", "model", lacks("audio input")),
    "messages_image_text_model": (400, None, None, lacks("image input")),
    "count_tokens_image_text_model": (400, None, None, lacks("image input")),
    "responses_image_text_model": (400, "model_not_supported", "model", lacks("image input")),
    "chat_temperature_string": (400, "invalid_request", "temperature",
                                "Invalid value for 'temperature'."),
    "chat_context_exceeded": (400, "context_length_exceeded", "messages", context("messages")),
    "messages_context_exceeded": (400, None, None, context("messages")),
    "responses_context_exceeded": (400, "context_length_exceeded", "input", context("input")),
    "responses_unknown_item": (400, "invalid_request", "input",
                               "An item of 'input' is of no type the model's engine reads."),
    "messages_bad_role_content": (400, None, None,
                                  "A message's content must be a string or an array of parts."),
    "chat_two_assistants_end": (400, "invalid_request", "messages",
                                "The messages end with two assistant messages: at most one may "
                                "come last."),
    "chat_logprobs_tools_stream": (400, "invalid_request", "logprobs",
                                   "'logprobs' cannot be asked for with tools in a stream."),
}  # fmt: skip


@dataclass
class Engine:
    """Answers every route with what it is told: a status and body, or a stream's events."""

    status: int = 200
    body: Any = None
    events: list[bytes] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not self.events:
            return web.json_response(self.body, status=self.status)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for event in self.events:
            await out.write(event + b"\n\n")
        return out


@dataclass
class Routed:
    engine: Engine
    url: str
    http: aiohttp.ClientSession

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], str]:
        headers = {"Authorization": f"Bearer {USER_SECRET}"}
        async with self.http.post(f"{self.url}{path}", json=body, headers=headers) as r:
            text = await r.text()
            return r.status, json.loads(text), text


@pytest.fixture
async def routed() -> AsyncIterator[Routed]:
    engine = Engine()
    app = web.Application()
    app.router.add_post("/v1/{path:.+}", engine.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    router = Router(FakeKeys(), FakeModels(MODEL), FakePool({MODEL: [endpoint(url)]}))
    async with serve(router) as base, aiohttp.ClientSession() as http:
        yield Routed(engine, base, http)
    await server.close()


def assert_no_engine_words(text: str, engine_message: str = "") -> None:
    if engine_message:
        assert engine_message not in text
    for word in ENGINE_WORDS:
        assert word not in text, word


def test_every_recorded_refusal_has_its_wording_here() -> None:
    assert set(TOLD) == set(RECORDED)


@pytest.mark.parametrize("name", sorted(RECORDED))
async def test_a_recorded_engine_refusal_is_told_in_the_routers_words(
    routed: Routed, name: str
) -> None:
    recorded = RECORDED[name]
    routed.engine.status, routed.engine.body = recorded["status"], recorded["body"]
    status, answer, text = await routed.post(recorded["path"], BODIES[recorded["path"]])
    expect, code, param, says = TOLD[name]
    assert status == expect
    if recorded["path"].startswith("/v1/messages"):  # Anthropic's shape
        assert answer == {"type": "error", "error": {"type": "invalid_request_error",
                                                     "message": says}}  # fmt: skip
    else:
        assert answer["error"]["message"] == says
        assert (answer["error"]["code"], answer["error"]["param"]) == (code, param)
    assert_no_engine_words(text, recorded["body"]["error"]["message"])


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "Some new check of the engine's: value 'x' is bad"),
        (500, "CUDA error: out of memory - hint: try --n-gpu-layers"),
        (401, "Invalid API Key"),
    ],
)
async def test_an_unknown_engine_message_is_never_quoted(
    routed: Routed, status: int, message: str
) -> None:
    routed.engine.status = status
    routed.engine.body = {"error": {"code": status, "message": message, "type": "server_error"}}
    got, answer, text = await routed.post("/v1/chat/completions", CHAT)
    assert message not in text and "value 'x'" not in text
    if status == 400:
        assert got == 400 and answer["error"]["code"] == "invalid_request"
        assert answer["error"]["message"] == "The model's engine refused the request."
    else:
        assert got == 502 and answer["error"]["code"] == "upstream_error"
        assert answer["error"]["message"] == "The model's engine failed on this request."


# The official clients.


async def test_the_openai_client_is_told_the_model_lacks_file_input(routed: Routed) -> None:
    recorded = RECORDED["responses_input_file"]
    routed.engine.status, routed.engine.body = recorded["status"], recorded["body"]
    part = {"type": "input_file", "file_data": "data:application/pdf;base64,JVBERi0=",
            "filename": "a.pdf"}  # fmt: skip
    items: list[Any] = [{"role": "user", "content": [part]}]
    async with openai.AsyncOpenAI(
        base_url=f"{routed.url}/v1", api_key=USER_SECRET, max_retries=0
    ) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model=MODEL, input=items)
    assert caught.value.code == "model_not_supported"
    assert caught.value.message.endswith(lacks("file input"))
    assert "llamacpp" not in str(caught.value.body)


async def test_the_anthropic_client_is_told_the_model_lacks_image_input(routed: Routed) -> None:
    recorded = RECORDED["messages_image_text_model"]
    routed.engine.status, routed.engine.body = recorded["status"], recorded["body"]
    async with anthropic.AsyncAnthropic(
        base_url=routed.url, api_key=USER_SECRET, max_retries=0
    ) as client:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(model=MODEL, messages=HI, max_tokens=8)
    assert caught.value.body == {
        "type": "error", "error": {"type": "invalid_request_error", "message": lacks("image input")}
    }  # fmt: skip


# An engine's error event inside a stream that already began, in each route's stream shape.
ENGINE_ERROR = {"code": 500, "message": RECORDED["chat_schema_bad_ref"]["body"]["error"]["message"],
                "type": "server_error"}  # fmt: skip


async def test_a_chat_streams_engine_error_event_is_in_the_routers_words(routed: Routed) -> None:
    delta = {"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
             "choices": [delta]}  # fmt: skip
    routed.engine.events = [
        b"data: " + json.dumps(chunk).encode(),
        b"data: " + json.dumps({"error": ENGINE_ERROR}).encode(),
    ]
    async with openai.AsyncOpenAI(
        base_url=f"{routed.url}/v1", api_key=USER_SECRET, max_retries=0
    ) as client:
        stream = await client.chat.completions.create(model=MODEL, messages=HI, stream=True)
        with pytest.raises(openai.APIError) as caught:
            async for _ in stream:
                pass
    assert caught.value.message == REF
    assert_no_engine_words(str(caught.value.body), ENGINE_ERROR["message"])


async def test_an_anthropic_streams_engine_error_event_is_in_the_routers_words(
    routed: Routed,
) -> None:
    """llama-server writes a Messages stream's error as `event: error` with its error object
    bare as the data (server-context.cpp, format_error for TASK_RESPONSE_TYPE_ANTHROPIC)."""
    events = (ANSWERS / "messages_stream.sse").read_bytes().split(b"\n\n")[:4]
    routed.engine.events = [*events, b"event: error\ndata: " + json.dumps(ENGINE_ERROR).encode()]
    async with (
        anthropic.AsyncAnthropic(base_url=routed.url, api_key=USER_SECRET, max_retries=0) as c,
        c.messages.stream(model=MODEL, messages=HI, max_tokens=8) as stream,
    ):
        with pytest.raises(anthropic.APIStatusError) as caught:
            await stream.get_final_text()
    assert caught.value.body == {
        "type": "error", "error": {"type": "invalid_request_error", "message": REF}
    }  # fmt: skip
    assert_no_engine_words(str(caught.value.body), ENGINE_ERROR["message"])


async def test_a_responses_streams_engine_error_event_is_in_the_routers_words(
    routed: Routed,
) -> None:
    """An engine that writes the Responses API's own error event (vLLM's shape)."""
    events = (ANSWERS / "responses_stream.sse").read_bytes().split(b"\n\n")[:3]
    said = "CUDA error: an illegal memory access - hint: --no-mmap"
    error = {"type": "error", "code": "server_error", "sequence_number": 3, "message": said,
             "param": None}  # fmt: skip
    routed.engine.events = [*events, b"event: error\ndata: " + json.dumps(error).encode()]
    async with openai.AsyncOpenAI(
        base_url=f"{routed.url}/v1", api_key=USER_SECRET, max_retries=0
    ) as client:
        stream = await client.responses.create(model=MODEL, input="hi", stream=True)
        last = [e async for e in stream][-1]
    assert isinstance(last, openai.types.responses.ResponseErrorEvent)
    assert last.message == "The model's engine failed on this request."
    assert last.sequence_number == 3
