"""What a /v1 route is to the router: one record each (router/v1_routes.py holds them), handed to
every concern of a request (checks, bounds, the proxy, cleaning, folding, usage, error shapes),
so that none looks a route up by its path."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmgwd.catalog import Model
from llmgwd.router.engine_refusals import Words
from llmgwd.router.errors import ApiError
from llmgwd.router.token_bounds import Estimate
from llmgwd.router.usage_events import Tally

Document = dict[str, Any]
Check = Callable[[Document], str]  # the body's checks; the model it names
Bound = Callable[[Document, Model, int, int], Estimate]  # (doc, model, body bytes, context)
Clean = Callable[[Document, str, Tally], Document | None]  # an answer or event as sent on
Shape = Callable[[ApiError, int], ApiError]  # an error in the route's shape (events before it)
Fold = Callable[[list[Document]], Document]  # a stream's events as one whole answer
Opening = Callable[[Document, str], "Document | None"]  # (first event, model): what must precede
NO_TOKENS = re.compile(rb"(?!)")  # matches nothing: a route whose streams carry no token


def as_is(error: ApiError, _events: int = 0) -> ApiError:
    """OpenAI's shape: the error as it is."""
    return error


@dataclass(frozen=True, slots=True, eq=False)
class Route:
    """One /v1 route and what each concern of the router does on it."""

    path: str  # after /v1/: "chat/completions"
    check: Check | None  # None: not a JSON body (transcriptions' form has its own reader)
    bound: Bound | None
    words: Words  # what an engine's refusal names on it
    clean: Clean | None = None  # its own answer shape's cleaning (None: OpenAI's completion)
    shape: Shape = as_is  # its errors' shape
    fold: Fold | None = None  # a generating route: asked as a stream, folded for a whole answer
    opening: Opening | None = None  # the event its streams must open with, if the engine's lacks
    tokens: re.Pattern[bytes] = NO_TOKENS  # what marks a stream event that carries a token
    usage_option: bool = False  # its streams' usage is asked by OpenAI's stream_options
    slots: bool = False  # llama.cpp's slot is chosen for it (client.cache_isolation)
