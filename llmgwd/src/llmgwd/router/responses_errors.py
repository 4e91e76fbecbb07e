"""Errors inside a /v1/responses stream as OpenAI's Responses API sends them (an `error` event,
llmgw.errors.RESPONSES)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from llmgw.errors import RESPONSES
from llmgwd.router import errors
from llmgwd.router.exchange import EXCHANGE


def shaped(error: errors.ApiError, sequence_number: int = 0) -> errors.ApiError:
    """error in the Responses API's shape (its status, headers and code kept for the log)."""
    out = error.reshaped(RESPONSES)
    out.sequence_number = max(out.sequence_number, sequence_number)
    return out


@contextmanager
def responses_shape(request: web.Request) -> Iterator[None]:
    """Every ApiError raised in the block (request's handler) leaves it in the Responses
    API's shape, numbered after the stream's events where one began."""
    try:
        yield
    except errors.ApiError as e:
        tally = request[EXCHANGE].tally
        raise shaped(e, tally.events or 0 if tally is not None else 0) from None
