"""Answers of the routes in their native shape, not OpenAI's completion (Responses, Anthropic's
Messages, rerank, transcriptions): each route's own clean() (its record's: router/v1_routes.py)
applied to a whole answer or to each event of a stream of named events (`event: NAME` then
`data: {...}`), their usage told to the tally."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec

from llmgwd.router.usage_events import Tally

Document = dict[str, Any]
Clean = Callable[[Document, str, Tally], Document | None]

_END = b"\n\n"
_encoder = msgspec.json.Encoder()


def whole(data: bytes, model: str, tally: Tally, clean: Clean) -> bytes:
    """A 200 answer as the client gets it; one that is not a JSON object, as it is."""
    tally.answered = True
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return data
    if not isinstance(doc, dict):
        return data
    return _encoder.encode(clean(doc, model, tally))


class NamedStream:
    """A stream's events, each cleaned by its route; an engine's error event is made by
    error(doc) (the route's own shape)."""

    def __init__(
        self,
        model: str,
        tally: Tally,
        clean: Clean,
        error: Callable[[Document], bytes],
        tokens: re.Pattern[bytes],
        opening: Callable[[Document, str], Document | None] | None = None,
    ) -> None:
        self._model = model
        self._tally = tally
        self._clean = clean
        self._error = error
        self._tokens = tokens  # what marks an event that carries a token
        self._opening = opening  # the event the stream must open with; None once seen

    def relay(self, block: bytes) -> bytes:
        """Whole events from the engine (a trailing partial one is passed on as it is)."""
        self._tally.count(block.count(_END), len(self._tokens.findall(block)))
        parts = block.split(_END)
        last = parts.pop()
        return b"".join(self._event(part) for part in parts) + last

    def _event(self, event: bytes) -> bytes:
        head, sep, data = event.rpartition(b"data:")
        if not sep:
            return event + _END
        try:
            doc = msgspec.json.decode(data)
        except msgspec.DecodeError:  # [DONE]
            return event + _END
        if not isinstance(doc, dict):
            return event + _END
        if "error" in doc and doc.get("type") in (None, "error"):
            return self._error(doc)
        opened = b""
        if self._opening is not None:  # the first event: the one the stream must open with
            first = self._opening(doc, self._model)
            self._opening = None
            if first is not None:
                opened = _named(first)
        kept = self._clean(doc, self._model, self._tally)
        if kept is None:
            return opened
        return opened + head + b"data: " + _encoder.encode(kept) + _END


def _named(doc: Document) -> bytes:
    """A named event of the router's own making (already clean)."""
    return b"event: " + str(doc["type"]).encode() + b"\ndata: " + _encoder.encode(doc) + _END
