"""The routes of today's clients on one real node (llmgwd, llmgw-agentd, the real llama-server
and SmolLM2): the official openai client's Responses API and the official anthropic client's
Messages API, their usage counted against the key, their errors each in its route's shape,
and tools passed to the engine (--jinja) through both."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from integration.harness import PrivateSystemd
from integration.llmgw_node import MODEL, Node
from integration.test_single_node import llama_server

CLIENT_PORT, CLUSTER_PORT = 17780, 17790  # apart from the other integration tests' ports
WEATHER: dict[str, object] = {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]
}
SAY_HI: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def node(systemd: PrivateSystemd) -> Iterator[Node]:
    n = Node(systemd, CLIENT_PORT, CLUSTER_PORT)
    n.install(llama_server(), address="")
    n.join(n.init_server())
    n.serve_model(1)
    n.key = n.llmgw("key", "create", "tests", "--json")["key"]
    yield n


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


def test_tools_reach_the_engine_through_both_clients(node: Node) -> None:
    """SmolLM2's own template has no tools, so llama-server answers in text; without --jinja
    it would refuse tools. Where the model does call the tool, the call is well shaped."""
    client, anthro = gpt(node, node.key), claude(node, node.key)
    tool: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    answer = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[tool],
                                     tool_choice="required", max_output_tokens=40)  # fmt: skip
    for item in answer.output:
        if item.type == "function_call":
            assert item.name == "get_weather" and item.arguments
    events = list(client.responses.create(model=MODEL, input="Weather in Paris?", tools=[tool],
                                          max_output_tokens=40, stream=True))  # fmt: skip
    assert events[-1].type == "response.completed"
    anthropic_tool: anthropic.types.ToolParam = {"name": "get_weather", "input_schema": WEATHER}
    message = anthro.messages.create(model=MODEL, messages=[{"role": "user", "content":
                                     "Weather in Paris?"}], tools=[anthropic_tool],
                                     tool_choice={"type": "any"}, max_tokens=40)  # fmt: skip
    for block in message.content:
        if block.type == "tool_use":
            assert block.name == "get_weather" and isinstance(block.input, dict)
    with anthro.messages.stream(model=MODEL, messages=SAY_HI, tools=[anthropic_tool],
                                max_tokens=20) as stream:  # fmt: skip
        assert stream.get_final_message().stop_reason in ("end_turn", "max_tokens", "tool_use")
