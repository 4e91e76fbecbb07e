"""POST /v1/responses (OpenAI's Responses API): its allow-list of fields, the tokens it may use,
and its answers and stream events as a client sees them, their usage read for the meter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from llmgwd.catalog import Model
from llmgwd.router import engine_refusals, errors, fields
from llmgwd.router.fields import MAX_TOOLS, Count, Object, Temperature, Text, Unit
from llmgwd.router.token_bounds import Estimate, check_context, one_limit
from llmgwd.router.usage_events import Tally

# What an engine's refusal names here (router/engine_refusals.py).
WORDS = engine_refusals.Words("responses", "input", "text", optional=True)

Document = dict[str, Any]

# The answer's fields a client sees: not llama.cpp's timings, nor the cached-token counts
# (DESIGN.md, "What a client sees of an engine").
_FIELDS = frozenset({"id", "object", "created_at", "completed_at", "status", "model", "output",
                     "usage", "error", "incomplete_details", "instructions", "tools",
                     "tool_choice", "text", "max_output_tokens", "temperature", "top_p",
                     "parallel_tool_calls", "metadata", "output_text"})  # fmt: skip
_USAGE = ("input_tokens", "output_tokens", "total_tokens")
_FINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


# Input items and their content parts: an allow-list of types. Images and files come inline
# (data: URLs): given a link, the engine would fetch it from the node.


class InputText(Struct, tag_field="type", tag="input_text"):
    text: str


class InputImage(Struct, tag_field="type", tag="input_image", forbid_unknown_fields=True):
    image_url: str | None = None
    file_id: str | None = None  # read to be refused by name
    detail: Literal["auto", "low", "high"] | None = None
    prompt_cache_breakpoint: Object | None = None


class InputFile(Struct, tag_field="type", tag="input_file", forbid_unknown_fields=True):
    file_data: str | None = None
    file_id: str | None = None  # read to be refused by name
    file_url: str | None = None  # read to be refused by name
    filename: str | None = None
    detail: Literal["auto", "low", "high"] | None = None
    prompt_cache_breakpoint: Object | None = None


class OutputText(Struct, tag_field="type", tag="output_text"):
    text: str


class Refusal(Struct, tag_field="type", tag="refusal"):
    refusal: str


Part = InputText | InputImage | InputFile | OutputText | Refusal


class MessageItem(Struct, tag_field="type", tag="message"):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]


class FunctionCallItem(Struct, tag_field="type", tag="function_call"):
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(Struct, tag_field="type", tag="function_call_output"):
    call_id: str
    output: str | list[InputText | InputImage | InputFile]


class ReasoningItem(Struct, tag_field="type", tag="reasoning"):
    summary: list[Object]


Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
_PARTS = ("input_text", "input_image", "input_file")
_CHOICES: fields.Values = {
    "input[].type": ("message", "function_call", "function_call_output", "reasoning"),
    "input[].role": ("user", "assistant", "system", "developer"),
    "input[].content[].type": (*_PARTS, "output_text", "refusal"),
    "input[].output[].type": _PARTS,
    "tool_choice": ("none", "auto", "required"),
}


class ResponsesRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/responses: what llama.cpp's and vLLM's Responses routes take (no stored
    conversations: previous_response_id is refused as unknown)."""

    model: Text
    input: str | Annotated[list[Item], Meta(min_length=1)]
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
    """The route's fields; returns the model's name. A message item may leave out its type
    (OpenAI's EasyInputMessage): "message" is written in, which engines read alike."""
    items = doc.get("input")
    if isinstance(items, list):
        for item in items:
            if isinstance(item, dict) and "role" in item and "type" not in item:
                item["type"] = "message"
    request = fields.checked(doc, ResponsesRequest, _CHOICES)
    if isinstance(request.input, list):
        for i, item in enumerate(request.input):
            if isinstance(item, MessageItem | FunctionCallOutputItem):
                parts = item.content if isinstance(item, MessageItem) else item.output
                where = "content" if isinstance(item, MessageItem) else "output"
                _inline(parts, f"input[{i}].{where}")
    return request.model


def _inline(parts: str | Sequence[Part], param: str) -> None:
    """Refuse an image or file given by link or stored file id: only data: URLs pass."""
    if isinstance(parts, str):
        return
    for j, part in enumerate(parts):
        at = f"{param}[{j}]"
        if isinstance(part, InputImage):
            if part.file_id is not None:
                raise fields.refuse_link(f"{at}.file_id", "images", "as data: URLs in image_url")
            if part.image_url is None:
                raise errors.missing_parameter(f"{at}.image_url")
            fields.inline_url(part.image_url, f"{at}.image_url", "images")
        elif isinstance(part, InputFile):
            for name in ("file_id", "file_url"):
                if getattr(part, name) is not None:
                    raise fields.refuse_link(f"{at}.{name}", "files", "as data: URLs in file_data")
            if part.file_data is None:
                raise errors.missing_parameter(f"{at}.file_data")
            fields.inline_url(part.file_data, f"{at}.file_data", "files")


def bound(doc: Document, model: Model, body_bytes: int, context: int = 0) -> Estimate:
    """As a chat's: the prompt at most the body's bytes, the answer max_output_tokens (written
    in when absent, so the engine holds to what was reserved)."""
    check_context(doc, context, body_bytes)
    return Estimate(
        prompt=body_bytes, completion=one_limit(doc, model, context, "max_output_tokens")
    )


def clean(doc: Document, model: str, tally: Tally) -> Document | None:
    """A whole answer or one stream event as the client gets it; usage told to tally."""
    if doc.get("object") == "response":
        return _response(doc, model, tally)
    doc.pop("timings", None)  # llama.cpp adds it beside response.completed's response
    if doc.get("type") == "error" and isinstance(doc.get("message"), str):  # an engine's
        return _error(doc, model)  # error event in the Responses API's shape (vLLM's)
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
    if isinstance(out.get("error"), dict):  # a failed response: the engine's words stay here
        out["error"] = {"code": "server_error", "message": engine_refusals.FAILED}
    return out


def opening(first: Document, model: str) -> Document | None:
    """The response.created a stream must open with, when the engine's first event is another
    (llama-server sends it with its first token's event, held back while that token is part
    of a character): the response that event carries, in progress and empty."""
    response = first.get("response")
    if first.get("type") == "response.created" or not isinstance(response, dict):
        return None
    opened = {k: v for k, v in response.items() if k in _FIELDS and k != "usage"}
    opened.update(model=model, status="in_progress", output=[])
    return {"type": "response.created", "sequence_number": 0, "response": opened}


def _error(found: Document, model: str) -> Document:
    """An engine's error event, its words replaced by the router's (its number kept)."""
    error = engine_refusals.of_object(500, found, model, WORDS).detail
    return {"type": "error", "code": error.code or error.type, "message": error.message,
            "param": error.param, "sequence_number": found.get("sequence_number")}  # fmt: skip
