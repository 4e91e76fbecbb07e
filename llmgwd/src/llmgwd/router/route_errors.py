"""An error written inside a stream, in the shape of its route's own error events: Anthropic's
on /v1/messages, the Responses API's on /v1/responses, OpenAI's chat shape elsewhere."""

from __future__ import annotations

from aiohttp import web

from llmgwd.router import anthropic_errors, errors, responses_errors
from llmgwd.router.usage_events import tally_of


def for_route(path: str, error: errors.ApiError, events: int = 0) -> errors.ApiError:
    """error in the shape of route path's errors, for what is written inside a stream, which
    no handler's own shaping sees; events: how many the stream carried before it."""
    if path.startswith("messages"):
        return anthropic_errors.shaped(error)
    if path == "responses":
        return responses_errors.shaped(error, events)
    return error


def for_request(request: web.Request, error: errors.ApiError) -> errors.ApiError:
    """error in the shape of the /v1 route request is on (its path after /v1/)."""
    tally = tally_of(request)
    events = tally.events or 0 if tally is not None else 0
    return for_route(request.path.partition("/v1/")[2], error, events)
