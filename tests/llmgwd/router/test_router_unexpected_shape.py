"""A failure the handler did not shape itself (a bug's 500, aiohttp's 405) is answered in its
route's own error shape: Anthropic's on /v1/messages, the Responses API's on /v1/responses
(issue 26, finding 3: the KeyError's 500 on /v1/messages came in OpenAI's shape)."""

from __future__ import annotations

from typing import Any

import pytest

from llmgwd.router.metering import Meter
from tests.llmgwd.router.test_router_v1 import (  # noqa: F401 (engine, gw: fixtures)
    MODEL,
    Gateway,
    assert_error_shape,
    engine,
    gw,
)

# The shape each route's error body must have: its keys, and its error object's keys.
_ANTHROPIC = ({"type", "error"}, {"type", "message"})
_OPENAI = ({"error"}, {"message", "type", "param", "code"})


def _shape(body: dict[str, Any]) -> tuple[set[str], set[str]]:
    return set(body), set(body["error"])


@pytest.mark.parametrize(
    ("path", "body", "shape"),
    [
        ("/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": []}, _ANTHROPIC),
        ("/v1/messages/count_tokens", {"model": MODEL, "messages": []}, _ANTHROPIC),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, _OPENAI),
    ],
)
async def test_a_bug_s_500_is_in_the_route_s_shape(
    gw: Gateway,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    body: dict[str, Any],
    shape: Any,
) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise KeyError("a bug of ours")

    monkeypatch.setattr(Meter, "_admit", broken)
    body["messages"] = [{"role": "user", "content": "hi"}]
    status, answer, resp = await gw.post(path, body)
    assert status == 500
    assert _shape(answer) == shape
    assert "a bug of ours" not in str(answer)  # nothing of the exception is told
    assert resp.headers["x-request-id"] in str(answer)  # the id staff find the log by


async def test_a_wrong_method_on_anthropic_s_route_is_in_anthropic_s_shape(
    gw: Gateway,  # noqa: F811
) -> None:
    async with gw.http.get(f"{gw.url}/v1/messages") as resp:
        assert resp.status == 405
        body = await resp.json()
    assert _shape(body) == _ANTHROPIC
    assert body["error"]["type"] == "invalid_request_error"
    async with gw.http.get(f"{gw.url}/v1/chat/completions") as resp:
        assert_error_shape(await resp.json(), "method_not_allowed")
