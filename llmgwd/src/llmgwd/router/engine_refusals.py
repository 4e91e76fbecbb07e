"""An engine's refusal as the client is told it, in the router's own words: an allow-list of
the engines' known messages, each mapped to what the router says (and the field concerned);
no other text of an engine (its flags, library, build or hints) is ever quoted."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

from llmgwd.router import errors

Document = dict[str, Any]

# What a model lacks, by the engine's words for it (llama.cpp names the flag it was not started
# with, or itself: the client is told what the model does not do, never how to start it).
_LACKS = (
    ("tools param requires", "tools"),
    ("tool_choice param requires", "tool_choice"),
    ("image input is not supported", "image input"),
    ("Multimodal data provided", "image or audio input"),
    ("audio input is not supported", "audio input"),
    ("video input is not supported", "video input"),
    ("'input_file' is not supported", "file input"),
)
_PROMPT = "<prompt>"  # in Known.param: the route's prompt field
_SCHEMA = "<schema>"  # in Known.param: the route's JSON schema field
_FIELD_NAME = r"([a-z_]{1,64})"
REFUSED = "The model's engine refused the request."
FAILED = "The model's engine failed on this request."


@dataclass(frozen=True, slots=True)
class Words:
    """What an engine's refusal names on a route (each route's record holds its own:
    router/v1_routes.py): its path, the field of its prompt, the field a JSON schema comes in
    (an engine's grammar is made of it), and whether an engine may lack the route (it answers
    404 or 501 for it: the client is told so)."""

    path: str
    prompt: str = "messages"
    schema: str | None = None
    optional: bool = False


@dataclass(frozen=True, slots=True)
class Known:
    """One of an engine's messages (matched from its start), what the client is told instead
    ({0}: the pattern's first group, a field's name, where it has one), and the field it
    concerns."""

    pattern: re.Pattern[str]
    says: str
    param: str | None


def _known(pattern: str, says: str, param: str | None) -> Known:
    return Known(re.compile(pattern, re.DOTALL), says, param)


# llama-server's words (tests/llmgwd/router/test_router_engine_words.py holds them as recorded),
# in order: the first that matches is told.
KNOWN = (
    _known(r"Failed to parse tools", "'tools' could not be read: each tool must be "
           '{"type": "function", "function": {"name": ..., "parameters": {...}}}.', "tools"),
    _known(r"Failed to parse messages", "'messages' could not be read: each message must "
           "have a role and content.", "messages"),
    _known(r"(?=.*JSON schema)(?=.*\$ref)", "A '$ref' in the JSON schema does not resolve: "
           "only references into the same schema ('#/...'), to parts it defines, are "
           "supported.", _SCHEMA),
    _known(r".*JSON schema", "The model's engine cannot follow this JSON schema.", _SCHEMA),
    _known(rf"Field '{_FIELD_NAME}'", "Invalid value for '{0}'.", "{0}"),
    _known(r"Cannot have 2 or more assistant messages at the end", "The messages end with "
           "two assistant messages: at most one may come last.", _PROMPT),
    _known(r"logprobs is not supported with tools \+ stream", "'logprobs' cannot be asked "
           "for with tools in a stream.", "logprobs"),
    _known(r"All non-assistant messages must contain 'content'", "Every message but an "
           "assistant's must have content.", _PROMPT),
    _known(r"Assistant message must contain either 'content' or 'tool_calls'", "An assistant "
           "message must have content or tool_calls.", _PROMPT),
    _known(r"Expected 'content' to be a string or an array", "A message's content must be a "
           "string or an array of parts.", _PROMPT),
    _known(r"Cannot determine type of 'item'", "An item of 'input' is of no type the model's "
           "engine reads.", "input"),
    _known(r"Invalid base64|Invalid uri|uri must be base64|Failed to load image",
           "An image or audio part could not be read: send it as base64 in a data: URL "
           "(data:image/png;base64,...).", _PROMPT),
    _known(r'"?[Ii]nput"? (?:content )?(?:must not|cannot) be empty', "'input' must not be "
           "empty.", "input"),
    _known(r'"prompt"', "'prompt' could not be read: send a string, a list of token ids, or "
           "a list of those.", "prompt"),
    _known(rf"Unsupported param: {_FIELD_NAME}$", "The model's engine does not support '{0}'.",
           "{0}"),
    _known(r"Only no echo is supported", "The model's engine does not support 'echo'.",
           "echo"),
    # The client's fault all the same (never a 502 that counts against the replica), with
    # nothing of it worth telling: a link the router lets through no more, a grammar's clash.
    _known(r"Failed to download|Cannot use both|Cannot use custom grammar", REFUSED, None),
)  # fmt: skip
FAILED = "The model's engine failed on this request."


def refusal(status: int, data: bytes, model: str, words: Words) -> errors.ApiError:
    """The engine's answer of this status (not 200) as an ApiError in the router's words: 400
    for what the client did (llama.cpp answers 500 for some), 502 for the engine's failures."""
    return of_object(status, error_object(data), model, words)


def of_object(status: int, found: Document, model: str, words: Words) -> errors.ApiError:
    """As refusal(), from the engine's error object ({"message", "type", ...})."""
    message, kind = _text(found, "message"), _text(found, "type")
    if kind == "exceed_context_size_error":
        prompt, context = found.get("n_prompt_tokens"), found.get("n_ctx")
        if isinstance(prompt, int) and isinstance(context, int):
            return errors.context_length_exceeded(words.prompt, prompt, context)
    lacks = _lacks(status, kind, message, words)
    if lacks:
        return errors.model_not_supported(model, lacks)
    for known in KNOWN:
        if m := known.pattern.match(message):
            says = known.says.format(*m.groups()) if m.groups() else known.says
            return errors.engine_refused(says, _param(known, m, words))
    if 400 <= status < 500 and status not in (401, 403):
        return errors.engine_refused(REFUSED)
    return errors.upstream_failed(FAILED)


def _param(known: Known, m: re.Match[str], words: Words) -> str | None:
    if known.param == _PROMPT:
        return words.prompt
    if known.param == _SCHEMA:
        return words.schema
    return None if known.param is None else known.param.format(*m.groups())


def error_object(data: bytes) -> Document:
    """The error object of an engine's body: {"error": {...}} (llama.cpp, OpenAI) or the body
    itself (vLLM's {"object": "error", "message": ...}); {} for anything else."""
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return {}
    if not isinstance(doc, dict):
        return {}
    inner = doc.get("error")
    if isinstance(inner, dict):
        return inner
    return doc if "message" in doc else {}


def _text(found: Document, key: str) -> str:
    value = found.get(key)
    return value if isinstance(value, str) else ""


def _lacks(status: int, kind: str, message: str, words: Words) -> str:
    """What the model does not do, when that is why the engine refused; else ""."""
    unsupported = status == 501 or kind == "not_supported_error"
    path = words.path
    if words.optional and (unsupported or status == 404):
        return "embeddings" if path == "embeddings" else f"/v1/{path}"
    for said, what in _LACKS:
        if said in message:
            return what
    return f"/v1/{path}" if unsupported else ""
