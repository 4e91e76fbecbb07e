"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API): their
allow-lists of fields, the tokens a request may use, and answers and stream events as a client
sees them, their usage read for the meter."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from llmgwd.catalog import Model
from llmgwd.router import fields
from llmgwd.router.fields import MAX_STOP, MAX_TOOLS, Count, Object, Text, TopK, Unit
from llmgwd.router.token_bounds import Estimate, check_context, one_limit
from llmgwd.router.usage_events import Tally

Document = dict[str, Any]

# Prompt tokens the engine read from its cache are prompt tokens all the same; how many were
# cached is not told (DESIGN.md, "What a client sees of an engine").
_CACHED = ("cache_read_input_tokens", "cache_creation_input_tokens")


class AnthropicMessage(Struct):
    role: Literal["user", "assistant"]
    content: str | list[Object]


class CountRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/messages/count_tokens."""

    model: Text
    messages: Annotated[list[AnthropicMessage], Meta(min_length=1)]
    system: str | list[Object] | None = None
    tools: Annotated[list[Object], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: Object | None = None
    thinking: Object | None = None


class MessagesRequest(CountRequest, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/messages."""

    max_tokens: Count
    stream: bool | None = None
    stop_sequences: Annotated[list[str], Meta(max_length=MAX_STOP)] | None = None
    temperature: Unit | None = None
    top_p: Unit | None = None
    top_k: TopK | None = None
    metadata: Object | None = None
    service_tier: str | None = None


def check(doc: Document) -> str:
    """The route's fields; returns the model's name."""
    return fields.checked(doc, MessagesRequest).model


def check_count(doc: Document) -> str:
    """count_tokens' fields; returns the model's name."""
    return fields.checked(doc, CountRequest).model


def bound(doc: Document, model: Model, body_bytes: int, placed: int = 0) -> Estimate:
    """As a chat's: the prompt at most the body's bytes, the answer max_tokens."""
    context = model.context or placed
    check_context(doc, context, body_bytes)
    return Estimate(prompt=body_bytes, completion=one_limit(doc, model, context, "max_tokens"))


def bound_count(doc: Document, model: Model, body_bytes: int, placed: int = 0) -> Estimate:
    """Counting tokens generates none: one request, no tokens to reserve."""
    return Estimate(prompt=0, completion=0)


def clean(doc: Document, model: str, tally: Tally) -> Document | None:
    """A whole answer or one stream event as the client gets it; usage told to tally (the
    prompt's in message_start, the answer's in message_delta)."""
    kind = doc.get("type")
    if kind == "message":
        _message(doc, model, tally)
    elif kind == "message_start" and isinstance(doc.get("message"), dict):
        _message(doc["message"], model, tally)
    elif kind == "message_delta" and isinstance(doc.get("usage"), dict):
        prompt = tally.usage[0] if tally.usage is not None else 0
        tally.took(prompt, doc["usage"].get("output_tokens"))
    elif "input_tokens" in doc and len(doc) == 1:  # count_tokens' answer
        tally.took(0, 0)
    return doc


def _message(doc: Document, model: str, tally: Tally) -> None:
    if "model" in doc:
        doc["model"] = model  # llama.cpp puts the model file's path there
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        return
    prompt = usage.get("input_tokens")
    for name in _CACHED:
        cached = usage.pop(name, None)
        if isinstance(prompt, int) and isinstance(cached, int):
            prompt += cached
    usage["input_tokens"] = prompt
    tally.took(prompt, usage.get("output_tokens"))
