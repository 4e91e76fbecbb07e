"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API): their
allow-lists of fields, the tokens a request may use, and answers and stream events as a client
sees them, their usage read for the meter."""

from __future__ import annotations

import secrets
from typing import Annotated, Any, Literal, get_args

import msgspec
from msgspec import Meta, Struct

from llmgwd.catalog import Model
from llmgwd.router import anthropic_errors, engine_refusals, fields
from llmgwd.router.fields import MAX_STOP, MAX_TOOLS, Count, Object, Text, TopK, Unit
from llmgwd.router.token_bounds import Estimate, check_context, one_limit
from llmgwd.router.usage_events import Tally

# What an engine's refusal names here (router/engine_refusals.py); count_tokens' own below.
WORDS = engine_refusals.Words("messages", "messages", "tools", optional=True)
COUNT_WORDS = engine_refusals.Words("messages/count_tokens", "messages", optional=True)

Document = dict[str, Any]

# Prompt tokens the engine read from its cache are prompt tokens all the same; how many were
# cached is not told (DESIGN.md, "What a client sees of an engine").
_CACHED = ("cache_read_input_tokens", "cache_creation_input_tokens")


# Content blocks: an allow-list of block and source types. An image comes inline (base64):
# given a source of type url, llama.cpp passes the URL on and fetches it from the node.


ImageType = Literal["image/jpeg", "image/png", "image/gif", "image/webp"]


class Base64Source(Struct, tag_field="type", tag="base64", forbid_unknown_fields=True):
    media_type: ImageType  # the engine makes the data: URL of it
    data: str


class UrlSource(Struct, tag_field="type", tag="url"):  # read to be refused by name
    url: str


class FileSource(Struct, tag_field="type", tag="file"):  # Anthropic's Files API: none here
    file_id: str


Source = Base64Source | UrlSource | FileSource


class TextBlock(Struct, tag_field="type", tag="text"):
    text: str


class ImageBlock(Struct, tag_field="type", tag="image", forbid_unknown_fields=True):
    source: Source
    cache_control: Object | None = None


class ToolUseBlock(Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: Object


class ToolResultBlock(Struct, tag_field="type", tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] | None = None
    is_error: bool | None = None


class ThinkingBlock(Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Struct, tag_field="type", tag="redacted_thinking"):
    data: str


Block = (
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)
_CHOICES: fields.Values = {
    "messages[].role": ("user", "assistant"),
    "messages[].content[].type": ("text", "image", "tool_use", "tool_result", "thinking",
                                  "redacted_thinking"),
    "messages[].content[].content[].type": ("text", "image"),
    "messages[].content[].source.type": ("base64",),
    "messages[].content[].content[].source.type": ("base64",),
    "messages[].content[].source.media_type": get_args(ImageType),
    "messages[].content[].content[].source.media_type": get_args(ImageType),
    "system[].type": ("text",),
}  # fmt: skip


class AnthropicMessage(Struct):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class CountRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/messages/count_tokens."""

    model: Text
    messages: Annotated[list[AnthropicMessage], Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
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
    return _inline(fields.checked(doc, MessagesRequest, _CHOICES))


def check_count(doc: Document) -> str:
    """count_tokens' fields; returns the model's name."""
    return _inline(fields.checked(doc, CountRequest, _CHOICES))


def _inline(request: CountRequest) -> str:
    """Refuse an image given by link or file id, a tool result's too; returns the model."""
    for i, message in enumerate(request.messages):
        if isinstance(message.content, str):
            continue
        for j, block in enumerate(message.content):
            param = f"messages[{i}].content[{j}]"
            if isinstance(block, ImageBlock):
                _inline_source(block.source, f"{param}.source")
            elif isinstance(block, ToolResultBlock) and isinstance(block.content, list):
                for k, part in enumerate(block.content):
                    if isinstance(part, ImageBlock):
                        _inline_source(part.source, f"{param}.content[{k}].source")
    return request.model


def _inline_source(source: Source, param: str) -> None:
    if not isinstance(source, Base64Source):
        name = "url" if isinstance(source, UrlSource) else "file_id"
        raise fields.refuse_link(f"{param}.{name}", "images", "a source of type 'base64'")


def bound(doc: Document, model: Model, body_bytes: int, context: int = 0) -> Estimate:
    """As a chat's: the prompt at most the body's bytes, the answer max_tokens."""
    check_context(doc, context, body_bytes)
    return Estimate(prompt=body_bytes, completion=one_limit(doc, model, context, "max_tokens"))


def bound_count(doc: Document, model: Model, body_bytes: int, context: int = 0) -> Estimate:
    """Counting generates nothing, but the engine reads the whole prompt: its bound (the
    body's bytes) is held against the key's tokens per minute, so a prompt larger than that
    limit is refused before an engine tokenizes it. Not billed (Estimate.billed)."""
    return Estimate(prompt=body_bytes, completion=0, billed=False)


def clean(doc: Document, model: str, tally: Tally) -> Document | None:
    """A whole answer or one stream event as the client gets it; usage told to tally (the
    prompt's in message_start, the answer's in message_delta)."""
    kind = doc.get("type")
    if kind == "message":
        _message(doc, model, tally)
    elif kind == "message_start" and isinstance(doc.get("message"), dict):
        _message(doc["message"], model, tally)
    elif kind == "message_delta" and isinstance(doc.get("usage"), dict):
        known = tally.usage is not None  # message_start told the prompt's tokens
        prompt = tally.usage[0] if tally.usage is not None else 0
        tally.took(prompt, doc["usage"].get("output_tokens"), known)
    elif "input_tokens" in doc and len(doc) == 1:  # count_tokens' answer: the tokens read,
        tally.took(doc["input_tokens"], 0)  # held against the key's rate, never billed
    elif isinstance(doc.get("message"), str):  # llama.cpp's error event: its error object bare
        return _error(doc, model)
    return doc


def opening(first: Document, model: str) -> Document | None:
    """The message_start a stream must open with, when the engine's first event is another:
    llama-server sends it only with its first token's event, which it holds back while that
    token is part of a character (a stream of one emoji has none). Its usage says 0: the
    engine never told the prompt's tokens (the router charges the prompt's bound)."""
    if first.get("type") == "message_start":
        return None
    message: Document = {
        "id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant",
        "content": [], "model": model, "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }  # fmt: skip
    return {"type": "message_start", "message": message}


def _error(found: Document, model: str) -> Document:
    """An engine's error event's data as Anthropic's, in the router's words."""
    code = found.get("code")
    status = code if isinstance(code, int) and not isinstance(code, bool) else 500
    error = engine_refusals.of_object(status, found, model, WORDS)
    body: Document = msgspec.json.decode(anthropic_errors.shaped(error).body())
    return body


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
    if isinstance(prompt, int):
        tally.took(prompt, usage.get("output_tokens"))
    else:  # the engine never told it (a stream opened by the router: opening())
        tally.took(0, usage.get("output_tokens"), prompt_told=False)
