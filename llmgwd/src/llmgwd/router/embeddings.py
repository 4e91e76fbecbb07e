"""POST /v1/embeddings: its body checks and the tokens a request may use (a prompt, no answer)."""

from __future__ import annotations

from typing import Any

from llmgwd.catalog import Model
from llmgwd.router import errors, fields
from llmgwd.router.token_bounds import Estimate, check_context

Document = dict[str, Any]


def check(doc: Document) -> str:
    """The route's fields (router.fields), and no stream; returns the model's name."""
    request = fields.embedding(doc)
    if request.stream:
        raise errors.invalid_value("stream", "Embeddings are not streamed: leave out 'stream'.")
    return request.model


def bound(doc: Document, model: Model, body_bytes: int, context: int = 0) -> Estimate:
    """At most as many prompt tokens as the body has bytes (as for completions), and none of an
    answer; an input certainly longer than context (what the model's replicas hold:
    token_bounds.held_context) is refused, as for completions. Each text (or token-id list) of
    a list counts as one request against a requests-per-minute limit, as each prompt of a
    completion does."""
    check_context(doc, context, body_bytes)
    return Estimate(prompt=body_bytes, completion=0, requests=fields.inputs("input", doc["input"]))
