"""Usage read from the engine's answer as the proxy relays it; a stream's usage chunk is passed
on only to a client that asked for it (the router always asks the engine). The chunks come
decoded from router/answers.py, which reads each event once."""

from __future__ import annotations

import time
from typing import Any, TypeGuard

import msgspec
from aiohttp import web


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Answer(msgspec.Struct):
    usage: _Usage | None = None


_answer_dec = msgspec.json.Decoder(_Answer)


class Tally:
    """What the engine said it used for one request, and what the client wants to see of it."""

    __slots__ = ("answered", "events", "first_at", "pass_usage", "usage")

    def __init__(self) -> None:
        self.answered = False  # the engine answered 200
        self.events: int | None = None  # stream events relayed (None: not a stream)
        self.usage: tuple[int, int] | None = None  # (prompt, completion) from the engine
        self.pass_usage = False  # the client asked for stream_options.include_usage
        self.first_at = 0.0  # perf_counter() at a stream's first event (0: none yet)

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

    def took(self, prompt: object, completion: object) -> None:
        """The engine's counts, kept when both are integers."""
        if _count(prompt) and _count(completion):
            self.usage = (prompt, completion)

    def stream_started(self) -> None:
        """A stream answer began (status 200)."""
        self.answered = True
        self.events = 0

    def count(self, events: int) -> None:
        """Stream events relayed (an answer cut short is counted by them)."""
        if not self.first_at and events:
            self.first_at = time.perf_counter()
        self.events = (self.events or 0) + events

    def chunk(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """One decoded stream chunk: its usage read, and dropped unless the client asked for
        it; None for a chunk the engine sent only because the router asked."""
        usage = chunk.get("usage")
        if not isinstance(usage, dict):
            return chunk
        self.took(usage.get("prompt_tokens"), usage.get("completion_tokens"))
        if self.pass_usage:
            return chunk
        if not chunk.get("choices"):
            return None
        del chunk["usage"]  # llama.cpp's /completions puts it on the last text chunk
        return chunk


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


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
