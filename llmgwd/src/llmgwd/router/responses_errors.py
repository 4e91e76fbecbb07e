"""Errors inside a /v1/responses stream as OpenAI's Responses API sends them: an `error` event,
{"type": "error", "code": ..., "message": ..., "param": ..., "sequence_number": ...}."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
from aiohttp import web

from llmgwd.router import errors
from llmgwd.router.usage_events import tally_of


class _Event(msgspec.Struct):
    """The Responses API's error event (openai's ResponseErrorEvent)."""

    code: str | None
    message: str
    param: str | None
    sequence_number: int
    type: str = "error"


class ResponsesError(errors.ApiError):
    """An ApiError whose stream event is the Responses API's; its body (an answer not yet
    begun) stays OpenAI's {"error": {...}}, as the Responses API answers one."""

    sequence_number = 0  # the stream's events before it, where known

    def sse_event(self) -> bytes:
        """`event: error`, the last of a stream that already began."""
        d = self.detail
        event = _Event(d.code or d.type, d.message, d.param, self.sequence_number)
        return b"event: error\ndata: " + msgspec.json.encode(event) + b"\n\n"


def shaped(error: errors.ApiError, sequence_number: int = 0) -> ResponsesError:
    """error as a ResponsesError (its status, headers and code kept for the log)."""
    out = error.reshaped(ResponsesError)
    out.sequence_number = max(out.sequence_number, sequence_number)
    return out


@contextmanager
def responses_shape(request: web.Request) -> Iterator[None]:
    """Every ApiError raised in the block (request's handler) leaves it as a ResponsesError,
    numbered after the stream's events where one began."""
    try:
        yield
    except errors.ApiError as e:
        tally = tally_of(request)
        raise shaped(e, tally.events or 0 if tally is not None else 0) from None
