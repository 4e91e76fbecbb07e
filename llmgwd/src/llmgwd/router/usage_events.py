"""Usage read from the engine's answer as the proxy relays it; a stream's usage chunk is passed
on only to a client that asked for it (the router always asks the engine)."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

_MARK = b'"usage"'  # only events holding this are decoded: a JSON key, or a text "usage"
_END = b"\n\n"  # llama.cpp and vLLM end events so; another ending is passed on unread


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Answer(msgspec.Struct):
    usage: _Usage | None = None


_answer_dec = msgspec.json.Decoder(_Answer)


class Tally:
    """What the engine said it used for one request, and what the client wants to see of it."""

    __slots__ = ("answered", "events", "pass_usage", "usage")

    def __init__(self) -> None:
        self.answered = False  # the engine answered 200
        self.events: int | None = None  # stream events relayed (None: not a stream)
        self.usage: tuple[int, int] | None = None  # (prompt, completion) from the engine
        self.pass_usage = False  # the client asked for stream_options.include_usage

    def whole(self, status: int, data: bytes) -> None:
        """A whole answer: its usage, when it is a success."""
        if status != 200:
            return
        self.answered = True
        try:
            usage = _answer_dec.decode(data).usage
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        if usage is not None:
            self.usage = (usage.prompt_tokens, usage.completion_tokens)

    def stream_started(self) -> None:
        """A stream answer began (status 200)."""
        self.answered = True
        self.events = 0

    def relay(self, block: bytes) -> bytes:
        """Whole events from the engine, as the client gets them: counted, usage read from
        them, and the usage chunk dropped unless the client asked for it."""
        self.events = (self.events or 0) + block.count(_END)
        if _MARK not in block:
            return block
        parts = block.split(_END)
        last = parts.pop()  # b"" after a complete last event
        return b"".join(self._event(part + _END) for part in parts) + last

    def _event(self, event: bytes) -> bytes:
        if _MARK not in event or not event.startswith(b"data:"):
            return event
        try:
            chunk: Any = msgspec.json.decode(event[5:])
        except msgspec.DecodeError:
            return event
        usage = chunk.get("usage") if isinstance(chunk, dict) else None
        if not isinstance(usage, dict):
            return event
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int):
            self.usage = (prompt, completion)
        if self.pass_usage:
            return event
        if not chunk.get("choices"):
            return b""  # the chunk the engine sent only because the router asked
        del chunk["usage"]  # llama.cpp's /completions puts it on the last text chunk
        return b"data: " + msgspec.json.encode(chunk) + _END


TALLY = web.RequestKey("llmgw_tally", Tally)  # set by the /v1 handler for the proxy


def ask_for_usage(doc: dict[str, Any]) -> bool:
    """Make a stream request ask the engine for usage; returns whether the client asked."""
    options = doc.get("stream_options")
    asked = isinstance(options, dict) and options.get("include_usage") is True
    kept = options if isinstance(options, dict) else {}
    doc["stream_options"] = {**kept, "include_usage": True}
    return asked


def tally_of(request: web.Request) -> Tally | None:
    """The tally the handler put on the request, if any."""
    tally: Tally | None = request.get(TALLY)  # .get() is not typed by key
    return tally
