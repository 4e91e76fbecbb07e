"""POST /v1/embeddings: its body checks and the tokens a request may use (a prompt, no answer)."""

from __future__ import annotations

from typing import Any

from llmgwd.catalog import Model
from llmgwd.router import errors
from llmgwd.router.token_bounds import Estimate

Document = dict[str, Any]


def check(doc: Document) -> None:
    """input is a text, or a non-empty array of texts, of token ids, or of arrays of token ids."""
    if doc.get("stream"):
        raise errors.invalid_value("stream", "Embeddings are not streamed: leave out 'stream'.")
    value = doc.get("input")
    if value is None:
        raise errors.missing_parameter("input")
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise errors.invalid_type("input", "a string or an array", value)
    if not value:
        raise errors.invalid_value("input", "'input' must not be an empty array.")
    kind = _kind(value[0], "input[0]")
    for i, item in enumerate(value):
        if _kind(item, f"input[{i}]") != kind:
            message = f"'input[{i}]' is not {kind} as 'input[0]' is: do not mix them."
            raise errors.invalid_value(f"input[{i}]", message)


def bound(doc: Document, model: Model, body_bytes: int) -> Estimate:
    """At most as many prompt tokens as the body has bytes (as for completions), and none of an
    answer; the engine refuses an input longer than its context itself."""
    return Estimate(prompt=body_bytes, completion=0)


def _kind(item: object, param: str) -> str:
    """What one element of an input array is: a text, a token id or an array of token ids."""
    if isinstance(item, str):
        return "a string"
    if _is_token(item):
        return "an integer"
    if isinstance(item, list) and all(_is_token(t) for t in item):
        return "an array of integers"
    raise errors.invalid_type(param, "a string, an integer or an array of integers", item)


def _is_token(item: object) -> bool:
    return isinstance(item, int) and not isinstance(item, bool)
