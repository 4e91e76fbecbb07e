"""The routes of today's clients on one real node (llmgwd, llmgw-agentd, the real llama-server
and SmolLM2): the official openai client's Responses API and the official anthropic client's
Messages API, their usage counted against the key, their errors each in its route's shape,
and a tool call made and answered through both, streamed and not."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from integration.harness import PrivateSystemd
from integration.llmgw_node import MODEL, Node, engine_counter, gguf, llama_server, serving

CLIENT_PORT, CLUSTER_PORT = 17780, 17790  # apart from the other integration tests' ports
GREEDY = {"temperature": 0}  # a field this anthropic client no longer names
TOOLS_MODEL = "smollm2-tools"  # the same model file with a chat template that calls functions
WEATHER: dict[str, object] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
SAY_HI: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def node(systemd: PrivateSystemd) -> Iterator[Node]:
    yield serving(systemd, llama_server(), CLIENT_PORT, CLUSTER_PORT)


def key(node: Node, name: str, *limits: str) -> str:
    secret: str = node.llmgw("key", "create", name, *limits, "--json")["key"]
    return secret


def gpt(node: Node, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.base_url, api_key=secret, max_retries=0, timeout=120)


def claude(node: Node, secret: str) -> anthropic.Anthropic:
    url = f"http://127.0.0.1:{node.client_port}"
    return anthropic.Anthropic(base_url=url, api_key=secret, max_retries=0, timeout=120)


def used(node: Node, name: str) -> dict[str, Any]:
    rows = node.llmgw("usage", "--by", "key", "--json")["rows"]
    found: dict[str, Any] = next(r for r in rows if r["name"] == name)
    return found


def test_responses_streamed_and_not_are_answered_and_counted(node: Node) -> None:
    client = gpt(node, key(node, "responses"))
    answer = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=8)
    assert answer.status in ("completed", "incomplete") and answer.output_text
    assert answer.model == MODEL and answer.usage is not None
    events = list(client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=8,
                                          stream=True))  # fmt: skip
    final = events[-1]
    assert final.type == "response.completed" and final.response.model == MODEL
    assert final.response.usage is not None and final.response.usage.output_tokens > 0
    counted = used(node, "responses")
    assert counted["requests"] == 2
    assert counted["completion_tokens"] == (
        answer.usage.output_tokens + final.response.usage.output_tokens
    )


def test_messages_streamed_and_not_are_answered_and_counted(node: Node) -> None:
    client = claude(node, key(node, "messages"))
    answer = client.messages.create(model=MODEL, messages=SAY_HI, max_tokens=8)
    assert answer.model == MODEL and answer.content[0].type == "text"
    with client.messages.stream(model=MODEL, messages=SAY_HI, max_tokens=8) as stream:
        text = stream.get_final_text()
        final = stream.get_final_message()
    assert text and final.usage.output_tokens > 0 and final.usage.input_tokens > 1
    assert client.messages.count_tokens(model=MODEL, messages=SAY_HI).input_tokens > 0
    counted = used(node, "messages")
    assert counted["requests"] == 3
    assert counted["prompt_tokens"] == answer.usage.input_tokens + final.usage.input_tokens
    assert counted["completion_tokens"] == answer.usage.output_tokens + final.usage.output_tokens


def leave(node: Node, secret: str, path: str, stream: bool) -> None:
    """A request of up to 400 tokens on path, left after 8 of its stream's events, or after
    1.5 s of waiting for its whole answer."""
    body: dict[str, Any] = {"model": MODEL, "stream": stream, "temperature": 0}
    story = "Tell me a long story about a dragon."
    if path == "responses":
        body.update(input=story, max_output_tokens=400)
    elif path == "completions":
        body.update(prompt=story, max_tokens=400)
    else:
        body.update(messages=[{"role": "user", "content": story}], max_tokens=400)
    url = f"http://127.0.0.1:{node.client_port}/v1/{path}"
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=1.5) as r:
            for _ in range(8 if stream else 10**6):
                r.readline()
                r.readline()  # an event and its blank line, or a line of the whole answer
    except TimeoutError:
        assert not stream  # a whole answer left waiting


def test_every_token_made_is_charged_when_clients_leave(node: Node) -> None:
    """Issue 26, findings 1 and 2, on the real llama-server: on each generating route, a stream
    left after a few events and a whole answer left while the engine works are charged the
    tokens the engine made (it is told, and stops), within a token per request."""
    scrape, secret = node.llmgw("metrics", "token", "--json")["token"], key(node, "leaves")
    before = engine_counter(node, scrape, "llamacpp_tokens_predicted_total")
    for path in ("chat/completions", "completions", "messages", "responses"):
        for stream in (True, False):
            leave(node, secret, path, stream)
    for _ in range(100):  # settled once each engine's rest was read
        counted = used(node, "leaves")
        if counted["requests"] == 8:
            break
        time.sleep(0.2)
    made = engine_counter(node, scrape, "llamacpp_tokens_predicted_total") - before
    assert counted["requests"] == 8
    assert 8 * 8 <= made < 8 * 400  # every request was left before its end
    assert abs(counted["completion_tokens"] - made) <= 8


def test_errors_are_each_in_their_routes_shape(node: Node) -> None:
    with pytest.raises(openai.AuthenticationError):
        gpt(node, "sk-llmgw-wrong").responses.create(model=MODEL, input="hi")
    with pytest.raises(anthropic.AuthenticationError) as a401:
        claude(node, "sk-llmgw-wrong").messages.create(model=MODEL, messages=SAY_HI, max_tokens=4)
    client, anthro = gpt(node, node.key), claude(node, node.key)
    with pytest.raises(openai.NotFoundError) as o404:
        client.responses.create(model="no-such-model", input="hi")
    with pytest.raises(anthropic.NotFoundError) as a404:
        anthro.messages.create(model="no-such-model", messages=SAY_HI, max_tokens=4)
    with pytest.raises(openai.BadRequestError) as o400:
        client.responses.create(model=MODEL, input="hi", extra_body={"bogus": 1})
    with pytest.raises(anthropic.BadRequestError) as a400:
        anthro.messages.create(model=MODEL, messages=SAY_HI, max_tokens=4, extra_body={"n": 2})
    one = key(node, "one-a-minute", "--rpm", "1")
    gpt(node, one).responses.create(model=MODEL, input="hi", max_output_tokens=2)
    with pytest.raises(openai.RateLimitError):
        gpt(node, one).responses.create(model=MODEL, input="hi", max_output_tokens=2)
    with pytest.raises(anthropic.RateLimitError) as a429:
        claude(node, one).messages.create(model=MODEL, messages=SAY_HI, max_tokens=2)
    assert o404.value.code == "model_not_found" and o400.value.code == "unknown_parameter"
    kinds = ["authentication_error", "not_found_error", "invalid_request_error",
             "rate_limit_error"]  # fmt: skip
    for e, kind in zip((a401, a404, a400, a429), kinds, strict=True):
        body: Any = e.value.body
        assert body["type"] == "error" and body["error"]["type"] == kind


def test_a_transcription_on_a_text_model_says_the_model_lacks_it(node: Node) -> None:
    """llama-server answers 501 for audio on a text-only model: a clear 400 in OpenAI's shape."""
    wav = b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00" + bytes(64)
    with pytest.raises(openai.BadRequestError) as e:
        gpt(node, node.key).audio.transcriptions.create(model=MODEL, file=("a.wav", wav))
    assert e.value.code == "model_not_supported" and e.value.param == "model"
    assert "/v1/audio/transcriptions" in e.value.message


# Tool calls with a real model. SmolLM2's own chat template has no tools, and llama.cpp's
# grammar for tool_choice "required" still lets a model write text before its call (and then
# stop at max_tokens): a second entry of the same model serves smollm2_calls.jinja (given
# inline with --chat-template), which steers SmolLM2 to open its answer with a JSON call, which
# the grammar then keeps well-formed (its function's name, its arguments' schema); greedy
# sampling makes each answer the same on every run.


def tools_node(node: Node) -> Node:
    """The tools model served beside MODEL (once per module)."""
    if TOOLS_MODEL not in [m["name"] for m in node.llmgw("models", "--json")]:
        template = (Path(__file__).parent / "smollm2_calls.jinja").read_text()
        node.llmgw("model", "add", TOOLS_MODEL, "--from", f"file:{gguf()}", "--engine",
                   "llama.cpp", f"--arg=--chat-template={template}")  # fmt: skip
        node.llmgw("model", "serve", TOOLS_MODEL, "--replicas", "1")
        node.wait(lambda: node.model(TOOLS_MODEL)["ready"] >= 1, "the tools model ready", 180)
    return node


def city_of(arguments: str | object) -> str:
    """The city a call's arguments name (a JSON text or an object)."""
    found = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert isinstance(found, dict) and isinstance(found["city"], str) and found["city"]
    return found["city"]


def test_a_chat_tool_call_streamed_and_not_and_its_answer(node: Node) -> None:
    client = gpt(tools_node(node), node.key)
    ask: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    answer = client.chat.completions.create(model=TOOLS_MODEL, messages=ask, tools=tools,
                                            tool_choice="required", temperature=0,
                                            max_tokens=60)  # fmt: skip
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert city_of(call.function.arguments) == "Paris"
    calls: dict[int, dict[str, str]] = {}  # the streamed deltas assembled, by index
    for chunk in client.chat.completions.create(model=TOOLS_MODEL, messages=ask, tools=tools,
                                                tool_choice="required", temperature=0,
                                                max_tokens=60, stream=True):  # fmt: skip
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            got = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            if delta.function is not None:
                got["name"] += delta.function.name or ""
                got["arguments"] += delta.function.arguments or ""
    assert [c["name"] for c in calls.values()] == ["get_weather"]
    assert city_of(calls[0]["arguments"]) == "Paris"
    told = [*ask, choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}]  # fmt: skip
    final = client.chat.completions.create(model=TOOLS_MODEL, messages=told, tools=tools,
                                           temperature=0, max_tokens=40)  # fmt: skip
    assert final.choices[0].finish_reason == "stop" and not final.choices[0].message.tool_calls
    assert "sunny" in (final.choices[0].message.content or "").lower()


def test_a_responses_tool_call_streamed_and_not_and_its_answer(node: Node) -> None:
    client = gpt(tools_node(node), node.key)
    tool: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    ask = "What is the weather in Paris?"
    answer = client.responses.create(model=TOOLS_MODEL, input=ask, tools=[tool],
                                     tool_choice="required", temperature=0,
                                     max_output_tokens=60)  # fmt: skip
    calls = [item for item in answer.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    assert city_of(calls[0].arguments) == "Paris"
    events = list(client.responses.create(model=TOOLS_MODEL, input=ask, tools=[tool],
                                          tool_choice="required", temperature=0,
                                          max_output_tokens=60, stream=True))  # fmt: skip
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert city_of(deltas) == "Paris"  # llama-server sends no function_call_arguments.done
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.type, getattr(i, "arguments", None)) for i in done] == [("function_call", deltas)]
    final = events[-1]
    assert final.type == "response.completed"
    assert [i.type for i in final.response.output] == ["function_call"]
    back: Any = [{"role": "user", "content": ask}, calls[0].model_dump(exclude_none=True),
                 {"type": "function_call_output", "call_id": calls[0].call_id,
                  "output": "Sunny, 21 C"}]  # fmt: skip
    told = client.responses.create(model=TOOLS_MODEL, input=back, tools=[tool], temperature=0,
                                   max_output_tokens=40)  # fmt: skip
    assert "sunny" in told.output_text.lower()


def test_an_anthropic_tool_use_streamed_and_not_and_its_answer(node: Node) -> None:
    client = claude(tools_node(node), node.key)
    tool: anthropic.types.ToolParam = {"name": "get_weather", "input_schema": WEATHER}
    ask: list[anthropic.types.MessageParam] = [
        {"role": "user", "content": "What is the weather in Paris?"}
    ]
    message = client.messages.create(model=TOOLS_MODEL, messages=ask, tools=[tool],
                                     tool_choice={"type": "any"}, extra_body=GREEDY,
                                     max_tokens=60)  # fmt: skip
    assert message.stop_reason == "tool_use"
    uses = [b for b in message.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id
    assert city_of(uses[0].input) == "Paris"
    with client.messages.stream(model=TOOLS_MODEL, messages=ask, tools=[tool],
                                tool_choice={"type": "any"}, extra_body=GREEDY,
                                max_tokens=60) as stream:  # fmt: skip
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use"
    blocks = [b for b in streamed.content if b.type == "tool_use"]
    assert [b.name for b in blocks] == ["get_weather"] and city_of(blocks[0].input) == "Paris"
    told: Any = [
        *ask,
        {"role": "assistant", "content": [uses[0].model_dump(exclude_none=True)]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 21 C"}]},
    ]  # fmt: skip
    final = client.messages.create(model=TOOLS_MODEL, messages=told, tools=[tool],
                                   extra_body=GREEDY, max_tokens=40)  # fmt: skip
    assert final.stop_reason == "end_turn" and final.content[0].type == "text"
    assert "sunny" in final.content[0].text.lower()


# Issue 26 finding 4: a flood of uploads within llmgwd's memory bound.


def anon_kib(node: Node, pid: int) -> int:
    """RssAnon of pid, in KiB: its heap, not the spools' file pages it maps to send them."""
    status = node.ps.run(["cat", f"/proc/{pid}/status"]).stdout
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("RssAnon:"))


def test_a_flood_of_uploads_stays_within_llmgwds_memory_bound(node: Node) -> None:
    """8 uploads of 24 MB at once (the reviewer's flood), model part first as openai's client
    sends it, while another key chats: llmgwd, under its unit's MemoryMax, is not killed, its
    anonymous memory (sampled through the flood) grows by the spools' share and not the
    uploads', and the chat is answered. (SmolLM2 has no audio: each upload is spooled, sent,
    and refused by it.)"""
    limit = node.ps.systemctl("show", "-P", "MemoryMax", "llmgwd.service").stdout.strip()
    assert limit == str(1568 * 1024 * 1024)
    pid = node.main_pid("llmgwd.service")
    before = anon_kib(node, pid)
    chatter, audio = key(node, "flood-chatter"), b"RIFF" + bytes(24 * 1000 * 1000)

    def upload() -> str:
        with pytest.raises(openai.BadRequestError) as e:
            gpt(node, node.key).audio.transcriptions.create(model=MODEL, file=("a.wav", audio))
        return str(e.value.code)

    def chat() -> str | None:
        answer = gpt(node, chatter).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
        )
        return answer.choices[0].message.content

    with ThreadPoolExecutor(9) as pool:
        floods = [pool.submit(upload) for _ in range(8)]
        said = pool.submit(chat)
        peak = before
        while not all(f.done() for f in floods):
            peak = max(peak, anon_kib(node, pid))
        codes = [f.result() for f in floods]
        assert said.result()
    after = anon_kib(node, pid)
    print(f"llmgwd RssAnon (KiB): before {before}, peak seen {peak}, after {after}")
    assert codes == ["model_not_supported"] * 8
    assert node.main_pid("llmgwd.service") == pid and node.restarts("llmgwd.service") == 0
    # The flood's 192 MB held whole would have raised it by hundreds of MB (the reviewer's:
    # 97 -> 497 MB); its spools are 8 x 2 MiB.
    assert peak - before < 64 * 1024
