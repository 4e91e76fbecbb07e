"""POST /v1/responses (OpenAI's Responses API): its allow-list of fields, the tokens it may use,
and its answers and stream events as a client sees them, their usage read for the meter."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from llmgwd.catalog import Model
from llmgwd.router import fields
from llmgwd.router.fields import MAX_TOOLS, Count, Object, Temperature, Text, Unit
from llmgwd.router.token_bounds import Estimate, check_context, one_limit
from llmgwd.router.usage_events import Tally

Document = dict[str, Any]

# The answer's fields a client sees: not llama.cpp's timings, nor the cached-token counts
# (DESIGN.md, "What a client sees of an engine").
_FIELDS = frozenset({"id", "object", "created_at", "completed_at", "status", "model", "output",
                     "usage", "error", "incomplete_details", "instructions", "tools",
                     "tool_choice", "text", "max_output_tokens", "temperature", "top_p",
                     "parallel_tool_calls", "metadata", "output_text"})  # fmt: skip
_USAGE = ("input_tokens", "output_tokens", "total_tokens")
_FINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/responses: what llama.cpp's and vLLM's Responses routes take (no stored
    conversations: previous_response_id is refused as unknown)."""

    model: Text
    input: str | Annotated[list[Object], Meta(min_length=1)]
    instructions: str | None = None
    stream: bool | None = None
    max_output_tokens: Count | None = None
    temperature: Temperature | None = None
    top_p: Unit | None = None
    tools: Annotated[list[Object], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | Object | None = None
    parallel_tool_calls: bool | None = None
    text: Object | None = None  # its format: text, json_object or json_schema
    reasoning: Object | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    user: str | None = None


def check(doc: Document) -> str:
    """The route's fields; returns the model's name."""
    return fields.checked(doc, ResponsesRequest).model


def bound(doc: Document, model: Model, body_bytes: int, placed: int = 0) -> Estimate:
    """As a chat's: the prompt at most the body's bytes, the answer max_output_tokens (written
    in when absent, so the engine holds to what was reserved)."""
    context = model.context or placed
    check_context(doc, context, body_bytes)
    return Estimate(prompt=body_bytes, completion=one_limit(doc, model, context,
                                                            "max_output_tokens"))


def clean(doc: Document, model: str, tally: Tally) -> Document | None:
    """A whole answer or one stream event as the client gets it; usage told to tally."""
    if doc.get("object") == "response":
        return _response(doc, model, tally)
    doc.pop("timings", None)  # llama.cpp adds it beside response.completed's response
    if doc.get("type") in _FINAL and isinstance(doc.get("response"), dict):
        doc["response"] = _response(doc["response"], model, tally)
    return doc


def _response(doc: Document, model: str, tally: Tally) -> Document:
    out = {k: v for k, v in doc.items() if k in _FIELDS}
    if "model" in out:
        out["model"] = model  # llama.cpp puts the model file's path there
    usage = out.get("usage")
    if isinstance(usage, dict):
        out["usage"] = {k: usage[k] for k in _USAGE if k in usage}
        tally.took(usage.get("input_tokens"), usage.get("output_tokens"))
    return out
