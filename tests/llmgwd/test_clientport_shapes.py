"""Errors the client port answers before any handler runs (a request aiohttp could not parse,
a path no sub-app has) come back in the shape of the sub-app the path is under: /api/v1's
ErrorAnswer, SCIM's error document, Anthropic's on /v1/messages, the Hugging Face hub's on /hf,
OpenAI's on the rest of /v1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from llmgw.api_types import ErrorAnswer
from llmgwd.clientport import listener
from llmgwd.router import errors
from tests.llmgwd.test_clientport import exchange, llmgwd

BAD_HEADER = b"Authorization : Bearer x\r\n"  # a space before the colon: aiohttp refuses it


def shape(path: str, doc: dict[str, Any]) -> str:
    """Which sub-app's error shape doc is in."""
    if path.startswith("/api/v1"):
        msgspec.convert(doc, ErrorAnswer)
        assert doc["error"].get("param", "") is not None  # OpenAI's says "param": null
        return "api"
    if path.startswith("/scim/v2"):
        assert doc["schemas"] == ["urn:ietf:params:scim:api:messages:2.0:Error"]
        assert doc["status"].isdigit() and doc["detail"]
        return "scim"
    if path.startswith("/v1/messages"):
        assert doc["type"] == "error" and set(doc["error"]) == {"type", "message"}
        return "anthropic"
    if path.startswith("/hf"):
        assert set(doc) == {"error"} and isinstance(doc["error"], str) and doc["error"]
        return "hub"
    assert set(doc["error"]) == {"message", "type", "param", "code"}
    return "openai"


PATHS = [
    "/api/v1/models",
    "/scim/v2/Users",
    "/v1/messages",
    "/v1/chat/completions",
    "/hf/api/models/org/repo",
]


@pytest.mark.parametrize("path", PATHS)
async def test_a_request_aiohttp_refuses_is_answered_in_its_sub_apps_shape(
    tmp_path: Path, path: str
) -> None:
    async with llmgwd(tmp_path) as port:
        head = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + BAD_HEADER + b"\r\n"
        answer = await exchange(port.port, head)
    assert answer.status == 400
    assert answer.headers["content-type"].startswith(("application/json", "application/scim"))
    shape(path, json.loads(answer.body))
    if path.startswith("/hf"):  # huggingface_hub shows it
        assert answer.headers["x-error-message"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("status", [400, 405, 413, 500])
def test_answer_puts_each_status_in_the_shape_of_the_path(path: str, status: int) -> None:
    error = errors.ApiError(status, "refused", "invalid_request_error", code="refused")
    response = listener.answer(path, error)
    assert response.status == status and response.headers["Server"] == "llmgw"
    assert response.body is not None
    assert isinstance(response.body, bytes)
    shape(path, json.loads(response.body))
    if path.startswith("/hf"):
        assert response.headers["X-Error-Message"] == "refused"
