"""A whole answer folded from the engine's stream is the answer the engine would have given:
llama-server's stream and whole answer to the same request at temperature 0 (llama_answers/fold/,
recorded as its README says) agree once folded; hostile or broken streams fold to an error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmgwd.router import folding
from llmgwd.router.v1_routes import ROUTES

FOLD = Path(__file__).parent / "llama_answers" / "fold"
PATHS = {
    "chat_completions": "chat/completions",
    "chat_tools": "chat/completions",
    "completions": "completions",
    "messages": "messages",
    "messages_tools": "messages",
    "responses": "responses",
}


def _fold(path: str, raw: bytes, pieces: int = 7) -> dict[str, Any]:
    """raw fed in uneven pieces (an event may be cut anywhere), then folded."""
    folder = folding.Folder(ROUTES[path])
    step = max(1, len(raw) // pieces)
    for i in range(0, len(raw), step):
        folder.feed(raw[i : i + step])
    answer: dict[str, Any] = json.loads(folder.answer())
    return answer


def _meaning(path: str, answer: dict[str, Any]) -> Any:
    """What a client reads of an answer (not its ids, times or the engine's cache counts)."""
    if path == "chat/completions":
        return [
            (c["index"], c["finish_reason"], c.get("logprobs"), c["message"].get("content") or None,
             [(t["type"], t["function"]) for t in c["message"].get("tool_calls") or []])
            for c in answer["choices"]
        ], answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]  # fmt: skip
    if path == "completions":
        choices = [
            (c["index"], c["text"], c["logprobs"], c["finish_reason"]) for c in answer["choices"]
        ]
        return choices, answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]
    if path == "messages":
        blocks = [{k: v for k, v in b.items() if k != "id"} for b in answer["content"]]
        return blocks, answer["stop_reason"], answer["usage"]["output_tokens"]
    return (
        answer["status"],
        [
            [{k: v for k, v in part.items()} for part in item["content"]]
            for item in answer["output"]
        ],
        answer["usage"]["input_tokens"],
        answer["usage"]["output_tokens"],
    )


@pytest.mark.parametrize("name", list(PATHS))
def test_llama_server_s_stream_folds_into_its_whole_answer(name: str) -> None:
    path = PATHS[name]
    whole = json.loads((FOLD / f"{name}.json").read_text())
    folded = _fold(path, (FOLD / f"{name}.sse").read_bytes())
    assert _meaning(path, folded) == _meaning(path, whole)


def test_tool_calls_fold_with_their_arguments_whole() -> None:
    folded = _fold("chat/completions", (FOLD / "chat_tools.sse").read_bytes())
    (call,) = folded["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert call["id"] and folded["choices"][0]["finish_reason"] == "tool_calls"
    message = _fold("messages", (FOLD / "messages_tools.sse").read_bytes())
    assert [(b["type"], b["name"], b["input"]) for b in message["content"]] == [
        ("tool_use", "get_weather", {"city": "Paris"})
    ]


def _sse(*docs: dict[str, Any]) -> bytes:
    return (
        b"".join(b"data: " + json.dumps(d).encode() + b"\n\n" for d in docs) + b"data: [DONE]\n\n"
    )


def test_choices_fold_by_their_index_and_absurd_indexes_are_dropped() -> None:
    def part(i: int, text: str, finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "c",
            "choices": [{"index": i, "delta": {"content": text}, "finish_reason": finish}],
        }

    raw = _sse(part(1, "b"), part(0, "a"), part(1, "B", "stop"), part(0, "A", "length"),
               part(10**9, "x"), part(-1, "y"))  # fmt: skip
    folded = _fold("chat/completions", raw)
    assert [
        (c["index"], c["message"]["content"], c["finish_reason"]) for c in folded["choices"]
    ] == [
        (0, "aA", "length"),
        (1, "bB", "stop"),
    ]


@pytest.mark.parametrize(
    ("path", "stream"),
    [  # Responses without its final response; Messages with no event at all (one without
        # message_start is opened by the router: test_router_held_back_start.py)
        ("responses", b'data: {"type":"response.output_text.delta","delta":"x"}\n\n'),
        ("messages", b"data: [DONE]\n\n"),
    ],
)
def test_a_stream_without_its_frame_is_unfinished(path: str, stream: bytes) -> None:
    folder = folding.Folder(ROUTES[path])
    folder.feed(stream)
    with pytest.raises(folding.Unfinished):
        folder.answer()


@pytest.mark.parametrize(
    ("path", "event", "status"),
    [  # llama-server's error events: OpenAI's {"error": {...}}, and its bare object on Messages
        ("chat/completions", b'data: {"error":{"code":400,"message":"bad","type":"x"}}\n\n', 400),
        ("messages", b'event: error\ndata: {"code":500,"message":"bad","type":"x"}\n\n', 500),
        ("responses", b'event: error\ndata: {"type":"error","code":"x","message":"bad"}\n\n', 500),
    ],
)
def test_an_engine_s_error_event_is_kept_with_its_status(
    path: str, event: bytes, status: int
) -> None:
    folder = folding.Folder(ROUTES[path])
    folder.feed(b'data: {"choices":[]}\n\n' + event + b'data: {"choices":[]}\n\n')
    assert folder.error is not None and b'"bad"' in folder.error
    assert folder.error_status == status
