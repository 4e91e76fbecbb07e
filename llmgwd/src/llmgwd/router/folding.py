"""A stream folded into the whole answer a client that did not ask for a stream gets: the router
asks every engine for a stream on the generating routes, so that what an engine made is counted
even when the client leaves before the end (DESIGN.md, "Metering")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from llmgwd.router.route import Route
from llmgwd.router.usage_events import Tally

Document = dict[str, Any]

_END = b"\n\n"
_MAX_INDEX = 127  # a choice's or tool call's index past this is not the engine's honest one
_FINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


class Unfinished(Exception):
    """The stream ended without what makes a whole answer (Messages' message_start,
    Responses' final response)."""


class Folder:
    """Collects the engine's stream events as they come and makes the route's whole answer of
    them (as the engine wrote it: router/answers.py cleans it once, as any whole answer), or
    keeps the engine's first error event."""

    def __init__(self, route: Route) -> None:
        assert route.fold is not None  # a generating route's
        self._route = route
        self._fold = route.fold
        self._docs: list[Document] = []
        self._tail = b""
        self.error: bytes | None = None  # the data of the engine's error event, if it sent one
        self.error_status = 500  # the status its error names, else 500

    def feed(self, block: bytes) -> None:
        """Cleaned events; a partial last one is kept until its end comes."""
        events = (self._tail + block).split(_END)
        self._tail = events.pop()
        for event in events:
            self._event(event)

    def tell(self, model: str, tally: Tally) -> None:
        """Tell tally the usage the events so far carry (Messages' message_start says the
        prompt's tokens), for an answer left before its end."""
        clean = self._route.clean
        if clean is not None:
            for doc in self._docs:
                clean(doc, model, tally)

    def answer(self) -> bytes:
        """The whole answer, as JSON; Unfinished if the stream did not make one."""
        if self._tail:
            self._event(self._tail)
            self._tail = b""
        opening, docs = self._route.opening, self._docs
        if opening is not None and docs and (first := opening(docs[0], "")) is not None:
            docs.insert(0, _unknown_prompt(first))  # the engine's own was never sent
        return _encoder.encode(self._fold(docs))

    def _event(self, event: bytes) -> None:
        head, sep, data = event.rpartition(b"data:")
        if not sep:
            return
        try:
            doc = _decoder.decode(data)
        except msgspec.DecodeError:  # [DONE]
            return
        if not isinstance(doc, dict):
            return
        if b"event: error" in head or "error" in doc or doc.get("type") == "error":
            if self.error is None:  # the first error ends the answer
                self.error, self.error_status = data, _status(doc)
            return
        self._docs.append(doc)


def _unknown_prompt(opening: Document) -> Document:
    """A stand-in opening event without its usage's prompt count (a whole answer shows null:
    the engine never told it, and the prompt's bound is charged)."""
    usage = opening.get("message", {}).get("usage")
    if isinstance(usage, dict):
        usage.pop("input_tokens", None)
    return opening


def _status(doc: Document) -> int:
    """The HTTP status an engine's error event names (llama.cpp's code), else 500."""
    inner = doc.get("error")
    code = inner.get("code") if isinstance(inner, dict) else doc.get("code")
    return code if isinstance(code, int) and 400 <= code <= 599 else 500


def chat(docs: list[Document]) -> Document:
    """chat.completion.chunk events as one chat.completion."""
    return _by_choice({"object": "chat.completion"}, docs, _chat_choice, _chat_delta)


def _by_choice(
    out: Document,
    docs: list[Document],
    new: Callable[[int], Document],
    add: Callable[[Document, Document], None],
) -> Document:
    """OpenAI's chunks folded choice by choice (by their index): new(i) starts choice i, add
    folds a chunk's part of it in; id, created, model and usage from the chunks."""
    choices: dict[int, Document] = {}
    for doc in docs:
        _head(out, doc)
        for part in _list(doc.get("choices")):
            i = part.get("index", 0)
            if isinstance(i, int) and 0 <= i <= _MAX_INDEX:
                add(choices.get(i) or choices.setdefault(i, new(i)), part)
    out["choices"] = [choices[i] for i in sorted(choices)]
    return out


def _chat_choice(i: int) -> Document:
    message = {"role": "assistant", "content": None}
    return {"index": i, "message": message, "logprobs": None, "finish_reason": None}


def _chat_delta(choice: Document, part: Document) -> None:
    message = choice["message"]
    delta = part.get("delta")
    for name, value in delta.items() if isinstance(delta, dict) else ():
        if name == "tool_calls":
            _tool_calls(message, _list(value))
        elif name == "role" and isinstance(value, str):
            message["role"] = value
        elif isinstance(value, str):  # content, reasoning_content, refusal
            message[name] = (message.get(name) or "") + value
    if part.get("finish_reason") is not None:
        choice["finish_reason"] = part["finish_reason"]
    logprobs = part.get("logprobs")
    if isinstance(logprobs, dict):
        held = choice["logprobs"] = choice["logprobs"] or {}
        for name in ("content", "refusal"):
            if isinstance(logprobs.get(name), list):
                held[name] = (held.get(name) or []) + logprobs[name]


def _tool_calls(message: Document, deltas: list[Document]) -> None:
    calls: list[Document] = message.setdefault("tool_calls", [])
    for delta in deltas:
        i = delta.get("index", len(calls))
        if not isinstance(i, int) or not 0 <= i <= _MAX_INDEX:
            continue
        while len(calls) <= i:
            calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        call = calls[i]
        for name in ("id", "type"):
            if isinstance(delta.get(name), str) and delta[name]:
                call[name] = delta[name]
        function = delta.get("function")
        if isinstance(function, dict):
            for name in ("name", "arguments"):
                if isinstance(function.get(name), str):
                    call["function"][name] += function[name]


def completion(docs: list[Document]) -> Document:
    """text_completion events as one text_completion."""
    return _by_choice({"object": "text_completion"}, docs, _text_choice, _text_part)


def _text_choice(i: int) -> Document:
    return {"index": i, "text": "", "logprobs": None, "finish_reason": None}


def _text_part(choice: Document, part: Document) -> None:
    if isinstance(part.get("text"), str):
        choice["text"] += part["text"]
    if part.get("finish_reason") is not None:
        choice["finish_reason"] = part["finish_reason"]
    _completion_logprobs(choice, part.get("logprobs"))


def _completion_logprobs(choice: Document, logprobs: object) -> None:
    if not isinstance(logprobs, dict):
        return
    held = choice["logprobs"] = choice["logprobs"] or {}
    for name, value in logprobs.items():
        if isinstance(value, list):
            held[name] = (held.get(name) or []) + value


def _head(out: Document, doc: Document) -> None:
    """id, created and model from the first chunk that has them; usage from the last."""
    for name in ("id", "created", "model"):
        if name not in out and name in doc:
            out[name] = doc[name]
    if isinstance(doc.get("usage"), dict):
        out["usage"] = doc["usage"]


def responses(docs: list[Document]) -> Document:
    """The Responses API's events: the final event's response is the whole answer."""
    for doc in reversed(docs):
        if doc.get("type") in _FINAL and isinstance(doc.get("response"), dict):
            final: Document = doc["response"]
            return final
    raise Unfinished("the stream ended without its final response")


def messages(docs: list[Document]) -> Document:
    """Anthropic's Messages events as one message."""
    message: Document | None = None
    blocks: dict[int, Document] = {}
    inputs: dict[int, str] = {}  # a tool_use block's input, as its JSON parts came
    for doc in docs:
        kind, i = doc.get("type"), doc.get("index")
        if kind == "message_start" and isinstance(doc.get("message"), dict):
            message = dict(doc["message"])
        elif kind == "message_delta" and message is not None:
            _message_delta(message, doc)
        elif not isinstance(i, int) or not 0 <= i <= _MAX_INDEX:
            continue
        elif kind == "content_block_start" and isinstance(doc.get("content_block"), dict):
            blocks[i] = dict(doc["content_block"])
        elif kind == "content_block_delta" and i in blocks:
            _block_delta(blocks[i], inputs, i, doc.get("delta"))
    if message is None:
        raise Unfinished("the stream ended without message_start")
    for i, text in inputs.items():
        try:
            blocks[i]["input"] = _decoder.decode(text) if text else {}
        except msgspec.DecodeError:
            blocks[i]["input"] = {}
    message["content"] = [blocks[i] for i in sorted(blocks)]
    return message


def _message_delta(message: Document, doc: Document) -> None:
    delta = doc.get("delta")
    if isinstance(delta, dict):
        message.update({k: v for k, v in delta.items() if k in ("stop_reason", "stop_sequence")})
    usage = doc.get("usage")
    if isinstance(usage, dict):
        held = message.get("usage")
        message["usage"] = {**(held if isinstance(held, dict) else {}), **usage}


def _block_delta(block: Document, inputs: dict[int, str], i: int, delta: object) -> None:
    if not isinstance(delta, dict):
        return
    kind = delta.get("type")
    for name, field in (("text_delta", "text"), ("thinking_delta", "thinking")):
        if kind == name and isinstance(delta.get(field), str):
            block[field] = (block.get(field) or "") + delta[field]
    if kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
        inputs[i] = inputs.get(i, "") + delta["partial_json"]
    elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
        block["signature"] = delta["signature"]


def _list(value: object) -> list[Document]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
