"""What of an engine's answer a client sees: OpenAI's fields only (no timings, no cached-token
counts, no engine build or file path), and engine refusals in OpenAI's shape, 400 for what was
the client's fault, with no engine internals (flags, library exceptions) in their messages."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Raw, UnsetType

from llmgwd.router import engine_refusals, errors, native_answers
from llmgwd.router.route import Route
from llmgwd.router.usage_events import Tally

Document = dict[str, Any]

_END = b"\n\n"  # llama.cpp and vLLM end events so; another ending is passed on unread

# The top-level fields of OpenAI's completion, chunk and embedding answers. Anything else an
# engine adds (llama.cpp's timings, prompt_progress, completion_probabilities, __verbose,
# system_fingerprint; vLLM's prompt_logprobs, kv_transfer_params) stays with the router.
_FIELDS = frozenset({"id", "object", "created", "model", "choices", "usage", "data"})
# The usage counts a client sees: not prompt_tokens_details, whose cached_tokens would tell a
# key whether another key sent the same prompt (DESIGN.md, "What a client sees of an engine").
_USAGE = frozenset(
    {"prompt_tokens", "completion_tokens", "total_tokens", "completion_tokens_details"}
)


class _Usage(msgspec.Struct):
    """The usage counts a client sees (_USAGE), typed: anything else is skipped unread."""

    prompt_tokens: Any = UNSET
    completion_tokens: Any = UNSET
    total_tokens: Raw | UnsetType = UNSET
    completion_tokens_details: Raw | UnsetType = UNSET


class _Answer(msgspec.Struct):
    """An answer or chunk with OpenAI's fields only (_FIELDS): decoding it skips the others,
    and its values pass as the engine's bytes (Raw), neither decoded nor re-encoded."""

    id: Raw | UnsetType = UNSET
    object: Raw | UnsetType = UNSET
    created: Raw | UnsetType = UNSET
    model: Raw | UnsetType = UNSET
    choices: list[Raw] | UnsetType | None = UNSET
    usage: _Usage | UnsetType | None = UNSET
    data: Raw | UnsetType = UNSET


_answer_dec = msgspec.json.Decoder(_Answer)
_encoder = msgspec.json.Encoder()


def _typed(data: bytes, model: str) -> _Answer | None:
    """The answer decoded to OpenAI's fields, named by the catalog's model; None when it is
    not of that shape (another body is left to the general path, clean())."""
    try:
        answer = _answer_dec.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if answer.model is not UNSET:
        answer.model = Raw(_encoder.encode(model))  # llama.cpp puts the model file's path there
    return answer


def clean(doc: Document, model: str) -> Document:
    """An answer or stream chunk with OpenAI's fields only, named by the catalog's model."""
    out = {k: v for k, v in doc.items() if k in _FIELDS}
    if "model" in out:
        out["model"] = model  # llama.cpp puts the model file's path on the node there
    usage = out.get("usage")
    if isinstance(usage, dict):
        out["usage"] = {k: v for k, v in usage.items() if k in _USAGE}
    return out


def success_body(data: bytes, model: str, tally: Tally, route: Route) -> bytes:
    """A 200 answer's body as the client gets it, its usage told to tally; one that is not a
    JSON object, as it is. A route of another shape than OpenAI's completion (Responses,
    Messages, rerank) is cleaned by its own module (its record's clean)."""
    if route.clean is not None:
        return native_answers.whole(data, model, tally, route.clean)
    tally.answered = True
    answer = _typed(data, model)
    if answer is None:
        tally.whole(200, data)
        try:
            doc = msgspec.json.decode(data)
        except msgspec.DecodeError:
            return data
        return _encoder.encode(clean(doc, model)) if isinstance(doc, dict) else data
    if isinstance(answer.usage, _Usage):
        usage = answer.usage
        prompt, completion = usage.prompt_tokens, usage.completion_tokens
        tally.took(0 if prompt is UNSET else prompt, 0 if completion is UNSET else completion)
    return _encoder.encode(answer)


def engine_error(status: int, data: bytes, model: str, route: Route) -> errors.ApiError:
    """The engine's refusal (status is not 200) as the client is told it, in the router's own
    words (router/engine_refusals.py) and the route's shape (Anthropic's on its routes)."""
    return route.shape(engine_refusals.refusal(status, data, model, route.words), 0)


class Stream:
    """A stream's events as the client gets them: usage read (and dropped unless the client
    asked), each chunk cleaned, an engine's error event put in OpenAI's shape."""

    def __init__(self, model: str, route: Route, tally: Tally, provider: bool = False) -> None:
        self._model = model
        self._route = route
        self._tally = tally
        self._provider = provider  # an external provider's: only its data events pass
        self._tokens = route.tokens
        self.failure: errors.ApiError | None = None  # the engine's error event, as told
        own = route.clean
        self._named = (
            None
            if own is None
            else native_answers.NamedStream(
                model, tally, own, self._error, self._tokens, route.opening
            )
        )

    def relay(self, block: bytes) -> bytes:
        """Whole events from the engine (a trailing partial one is passed on as it is)."""
        if self._named is not None:
            return self._named.relay(block)
        self._tally.count(block.count(_END), len(self._tokens.findall(block)))
        parts = block.split(_END)
        last = parts.pop()  # b"" after a complete last event
        return b"".join(self._event(part) for part in parts) + last

    def _event(self, event: bytes) -> bytes:
        if not event.startswith(b"data:"):
            return self._foreign(event) if self._provider else event + _END
        if b'"error"' not in event and (chunk := _typed(event[5:], self._model)) is not None:
            return self._chunk(chunk)
        try:
            doc = msgspec.json.decode(event[5:])
        except msgspec.DecodeError:  # [DONE]
            return event + _END
        if not isinstance(doc, dict):
            return event + _END
        if "error" in doc:
            return self._error(doc)
        kept = self._tally.chunk(doc)
        if kept is None:
            return b""  # the usage chunk the engine sent only because the router asked
        return b"data: " + _encoder.encode(clean(kept, self._model)) + _END

    def _foreign(self, event: bytes) -> bytes:
        """A provider's event that is no plain data: line, never passed on as it came: a
        comment or an event without data dropped, an `event: error` as the route's own error
        (in our words), another named event's data as a data: event."""
        lines = event.split(b"\n")
        data = b"\n".join(x[5:].removeprefix(b" ") for x in lines if x.startswith(b"data:"))
        if any(x.replace(b" ", b"") == b"event:error" for x in lines):
            return self._error(_error_doc(data))
        return self._event(b"data: " + data) if data else b""

    def _error(self, doc: Document) -> bytes:
        """An engine's error event in the route's shape."""
        code = doc["error"].get("code") if isinstance(doc["error"], dict) else None
        status = code if isinstance(code, int) else 500
        raw = msgspec.json.encode(doc)
        route = self._route
        error = engine_refusals.refusal(status, raw, self._model, route.words)
        self.failure = route.shape(error, self._tally.events or 0)
        return self.failure.sse_event()

    def _chunk(self, chunk: _Answer) -> bytes:
        """A typed chunk: its usage read, and dropped as Tally.chunk drops it."""
        usage = chunk.usage
        if isinstance(usage, _Usage):
            self._tally.took(usage.prompt_tokens, usage.completion_tokens)
            if not self._tally.pass_usage:
                if not chunk.choices:
                    return b""  # the usage chunk the engine sent only because the router asked
                chunk.usage = UNSET  # llama.cpp's /completions puts it on the last text chunk
        return b"data: " + _encoder.encode(chunk) + _END


def _error_doc(data: bytes) -> Document:
    """An error event's data as {"error": ...}, whatever the provider put there."""
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError:
        doc = None
    if isinstance(doc, dict) and "error" in doc:
        return doc
    return {"error": doc if isinstance(doc, dict) else {}}
