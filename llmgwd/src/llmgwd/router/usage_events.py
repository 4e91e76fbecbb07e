"""Usage read from the engine's answer as the proxy relays it; a stream's usage chunk is passed
on only to a client that asked for it (the router always asks the engine). The chunks come
decoded from router/answers.py, which reads each event once. A stream's token-bearing events
are counted too, for a stream that ends before the engine's final usage."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, TypeGuard

import msgspec


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Answer(msgspec.Struct):
    usage: _Usage | None = None


_answer_dec = msgspec.json.Decoder(_Answer)


class Tally:
    """What the engine said it used for one request, and what the client wants to see of it."""

    __slots__ = ("answered", "draining", "events", "first_at", "on_drained", "pass_usage",
                 "prompt_told", "tokens", "usage")  # fmt: skip

    def __init__(self) -> None:
        self.answered = False  # the engine answered 200
        self.events: int | None = None  # stream events relayed (None: not a stream)
        self.tokens = 0  # a stream's events that carried a token (text, reasoning, arguments)
        self.usage: tuple[int, int] | None = None  # (prompt, completion) from the engine
        self.prompt_told = True  # usage's prompt is the engine's (not a stand-in 0)
        self.pass_usage = False  # the client asked for stream_options.include_usage
        self.first_at = 0.0  # perf_counter() at a stream's first event (0: none yet)
        # The client left and the engine's rest is still being read (router/proxy.py): the
        # request is settled when it ends, by on_drained.
        self.draining = False
        self.on_drained: Callable[[], None] | None = None

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

    def took(self, prompt: object, completion: object, prompt_told: bool = True) -> None:
        """The engine's counts, kept when both are integers; prompt_told false: the engine
        said the completion's count only (the prompt's bound is charged)."""
        if _count(prompt) and _count(completion):
            self.usage = (prompt, completion)
            self.prompt_told = prompt_told

    def stream_started(self) -> None:
        """A stream answer began (status 200)."""
        self.answered = True
        self.events = 0

    def count(self, events: int, tokens: int = 0) -> None:
        """Stream events relayed, and of them those that carried a token (an answer cut short
        is counted by them)."""
        if not self.first_at and events:
            self.first_at = time.perf_counter()
        self.events = (self.events or 0) + events
        self.tokens += tokens

    def drained(self) -> None:
        """The engine's rest was read (or given up on): settle now if the handler is done."""
        self.draining = False
        settle, self.on_drained = self.on_drained, None
        if settle is not None:
            settle()

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


# A stream event that carries a token, on each protocol (a route's record names its own:
# router/v1_routes.py): a delta of text, reasoning or a tool call's arguments (llama.cpp and vLLM
# stream one token an event, or fewer events than tokens).
CHUNK_TOKENS = re.compile(
    rb'"(?:content|reasoning_content|reasoning|refusal|arguments|text)":\s*"(?!")'
)  # OpenAI's chunks
MESSAGES_TOKENS = re.compile(rb'"type":\s*"content_block_delta"')  # Anthropic's events
RESPONSES_TOKENS = re.compile(rb'"type":\s*"response\.[a-z_.]+\.delta"')  # the Responses API's


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def ask_for_usage(doc: dict[str, Any]) -> bool:
    """Make a stream request ask the engine for usage; returns whether the client asked."""
    options = doc.get("stream_options")
    asked = isinstance(options, dict) and options.get("include_usage") is True
    kept = options if isinstance(options, dict) else {}
    doc["stream_options"] = {**kept, "include_usage": True}
    return asked
