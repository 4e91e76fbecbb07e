"""test_fuzz.py's raw client, its shared strategies, and the bodies, forms, paths and error-shape
checks of the routes beyond OpenAI's chat: Anthropic's, the Responses API, rerank,
transcriptions (multipart), the hub's /hf and SCIM."""

from __future__ import annotations

import copy
import hashlib
import http.client
import json
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import hypothesis
from hypothesis import strategies as st

from integration.llmgw_node import MODEL

# 503s llmgw gives on purpose (with Retry-After): the model is starting, or busy.
EXPECTED_503 = {"model_not_ready", "model_busy"}
# Fields engines take that change how much they generate, which slot is used, or what of their
# internals they return: these must never pass as they are.
ENGINE_FIELDS = [
    "n_predict", "ignore_eos", "id_slot", "t_max_predict_ms", "cache_prompt", "n_probs",
    "n_keep", "n_discard", "samplers", "lora", "grammar", "json_schema", "post_sampling_probs",
    "return_tokens", "timings_per_token", "n_indent", "n_cmpl", "min_keep", "dry_multiplier",
    "slot_id", "response_fields", "return_progress", "chat_template_kwargs", "api_base",
]  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
small_ints = st.integers(min_value=-3, max_value=40) | st.integers(
    min_value=-(2**40), max_value=2**63
)
# Fields of the hosted APIs that llmgw does not take (stored state, background runs).
REFUSED_FIELDS = ["previous_response_id", "background", "conversation", "include", "truncation",
                  "prompt_cache_key", "container", "mcp_servers"]  # fmt: skip
engine_fields = st.dictionaries(st.sampled_from(ENGINE_FIELDS), json_values, max_size=2)
raw_bodies = st.binary(max_size=200) | st.sampled_from(
    [b"", b"null", b"[]", b'{"model": NaN}', b"{" * 5000, b'{"model":"' + MODEL.encode() + b'"'],
)
# Header values http.client sends as they are: printable ASCII, no CR or LF.
header_text = st.text(alphabet=string.printable.strip("\r\n\t\x0b\x0c"), max_size=40)


# A raw client: any method, path (already quoted), headers (a name may repeat) and body.


@dataclass
class Answer:
    """One answer, read to its end, and the request it answers (for assertion messages)."""

    status: int
    headers: http.client.HTTPMessage
    body: bytes
    where: str = ""

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")

    def json(self) -> Any:
        return json.loads(self.body)


def send(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: list[tuple[str, str]] | None = None,
) -> Answer:
    """method path on 127.0.0.1:port, its answer read to its end."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.putrequest(method, path, skip_host=False, skip_accept_encoding=True)
        for name, value in headers or []:
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    shown = [
        (k, v[:80]) for k, v in headers or [] if k.lower() not in ("authorization", "x-api-key")
    ]
    where = f"{method} {path[:300]} {shown} {(body or b'')[:300]!r} -> {r.status}: {data[:500]!r}"
    return Answer(r.status, r.headers, data, where)


def tally(answer: Answer) -> Answer:
    """answer, its status counted in hypothesis's statistics (--hypothesis-show-statistics)."""
    stream = answer.content_type.startswith("text/event-stream")
    hypothesis.event(f"{answer.status}{' stream' if stream else ''} {_reason(answer)}")
    return answer


def _reason(answer: Answer) -> str:
    """An error's code (OpenAI's, the hub's) or type (Anthropic's, SCIM's), else ""."""
    if answer.status < 400 or not answer.content_type.startswith("application/"):
        return answer.headers.get("X-Error-Code", "")
    try:
        doc = answer.json()
    except ValueError:
        return "not JSON"
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict):
        said = str(error.get("message", "")).partition(":")[0][:50]
        return str(error.get("code") or f"{error.get('type')}: {said}")
    return str(doc.get("scimType", "")) if isinstance(doc, dict) else ""


def events(text: str) -> Iterator[Any]:
    """The JSON of each `data:` line of a stream (but [DONE])."""
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line.removeprefix("data: "))


# Mutations of valid documents: the same shape with a field dropped, replaced by any JSON,
# wrapped in a list, turned into its JSON text or a long string, or an unknown field added.


def _spots(doc: Any) -> list[tuple[Any, Any]]:
    """(container, key or index) of every value inside doc."""
    out: list[tuple[Any, Any]] = []
    todo = [doc]
    while todo:
        c = todo.pop()
        keys = list(c) if isinstance(c, dict) else range(len(c)) if isinstance(c, list) else []
        for k in keys:
            out.append((c, k))
            todo.append(c[k])
    return out


def _containers(doc: Any) -> list[Any]:
    return [doc] * isinstance(doc, dict) + [c[k] for c, k in _spots(doc) if isinstance(c[k], dict)]


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[Any], most: int = 3) -> Any:
    """A document of base with up to most mutations (none: base's own)."""
    doc = copy.deepcopy(draw(base))
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, most]))):
        how = draw(st.sampled_from(["drop", "junk", "wrap", "text", "long", "add"]))
        if how == "add" and (dicts := _containers(doc)):
            name = draw(st.sampled_from(ENGINE_FIELDS + REFUSED_FIELDS) | st.text(max_size=12))
            draw(st.sampled_from(dicts))[name] = draw(json_values)
            continue
        spots = _spots(doc)
        if not spots:
            return draw(json_values)
        c, k = draw(st.sampled_from(spots))
        if how == "drop":
            del c[k]
        elif how == "junk":
            c[k] = draw(json_values)
        elif how == "wrap":
            c[k] = [c[k]]
        elif how == "text":
            c[k] = json.dumps(c[k])
        else:
            c[k] = "x" * draw(st.integers(200, 5000))
    return doc


def near(base: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly base's documents mutated, sometimes any JSON."""
    return st.one_of(mutated(base), mutated(base), mutated(base), json_values)


def auth_headers(kind: str, key: str) -> list[tuple[str, str]]:
    """A key as kind says: bearer, x-api-key (Anthropic's), a wrong key, or none."""
    return {
        "bearer": [("Authorization", f"Bearer {key}")],
        "x-api-key": [("x-api-key", key)],
        "wrong": [("Authorization", "Bearer sk-llmgw-not-a-key")],
        "none": [],
    }[kind]


# Checks of each route's error shape.


def has_key(doc: Any, name: str) -> bool:
    """Whether any object inside doc has a field name (an engine's own, as llama.cpp's
    timings: never a client's to see)."""
    return any(isinstance(c, dict) and name in c for c in [doc, *(c[k] for c, k in _spots(doc))])


def check_openai_error(data: Any, where: str) -> None:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}, codes as strings."""
    assert isinstance(data, dict) and isinstance(data.get("error"), dict), (where, data)
    err = data["error"]
    assert isinstance(err.get("message"), str) and err["message"], (where, data)
    assert isinstance(err.get("type"), str), (where, data)
    assert err.get("param") is None or isinstance(err["param"], str), (where, data)
    assert err.get("code") is None or isinstance(err["code"], str), (where, data)
    assert not has_key(data, "timings"), (where, data)


def check_openai_answer(a: Answer) -> Any:
    """No 5xx of llmgw's own (a 503 says why), any error in OpenAI's shape; the answer's JSON
    (None for a stream, whose error events are OpenAI's too)."""
    assert a.status < 500 or a.status == 503, a.where
    if a.content_type.startswith("text/event-stream"):
        assert a.status == 200, a.where
        for event in events(a.text):
            assert "timings" not in event, a.where
            if "error" in event:
                check_openai_error(event, a.where)
        return None
    data = a.json()
    if a.status == 503:
        assert data["error"]["code"] in EXPECTED_503, a.where
    if a.status >= 400:
        check_openai_error(data, a.where)
    return data


ANTHROPIC_TYPES = {
    "invalid_request_error", "authentication_error", "permission_error", "not_found_error",
    "request_too_large", "rate_limit_error", "api_error", "overloaded_error", "timeout_error",
}  # fmt: skip


def check_anthropic_error(data: Any, where: str) -> None:
    """Anthropic's: {"type": "error", "error": {"type", "message"}}, its known types."""
    assert isinstance(data, dict) and set(data) == {"type", "error"}, where
    assert data["type"] == "error" and isinstance(data["error"], dict), where
    assert set(data["error"]) == {"type", "message"}, where
    assert data["error"]["type"] in ANTHROPIC_TYPES, where
    assert isinstance(data["error"]["message"], str) and data["error"]["message"], where


def check_anthropic_answer(a: Answer, count: bool) -> None:
    """/v1/messages[/count_tokens]: no 5xx but a 503 with Retry-After, errors and error events
    in Anthropic's shape, a message (or count) otherwise."""
    assert a.status < 500 or (a.status == 503 and "Retry-After" in a.headers), a.where
    if a.content_type.startswith("text/event-stream"):
        assert a.status == 200 and not count, a.where
        first: Any = next(events(a.text), {})
        assert first.get("type") in ("message_start", "error"), f"first event: {a.where}"
        for event in events(a.text):
            assert isinstance(event, dict) and isinstance(event.get("type"), str), a.where
            assert not has_key(event, "timings"), a.where
            if event["type"] == "error" or "error" in event:
                check_anthropic_error(event, a.where)
        return
    data = a.json()
    if a.status >= 400:
        check_anthropic_error(data, a.where)
    elif count:
        assert set(data) == {"input_tokens"} and isinstance(data["input_tokens"], int), a.where
    else:
        assert data.get("type") == "message" and isinstance(data.get("usage"), dict), a.where
        assert not has_key(data, "timings"), a.where


def check_responses_event(event: Any, where: str) -> None:
    """The Responses API's error event: {"type": "error", "code", "message", "param",
    "sequence_number"}."""
    assert set(event) == {"type", "code", "message", "param", "sequence_number"}, where
    assert event["code"] is None or isinstance(event["code"], str), where
    assert isinstance(event["message"], str) and event["message"], where
    assert event["param"] is None or isinstance(event["param"], str), where
    assert isinstance(event["sequence_number"], int), where


def check_responses_answer(a: Answer) -> None:
    """/v1/responses: an answer not begun errs in OpenAI's shape; a stream's events are the
    Responses API's (each typed, its error event its own)."""
    if not a.content_type.startswith("text/event-stream"):
        data = check_openai_answer(a)
        if a.status < 400:
            assert data.get("object") == "response" and "timings" not in data, a.where
        return
    assert a.status == 200, a.where
    first: Any = next(events(a.text), {})
    assert first.get("type") in ("response.created", "error"), f"first event: {a.where}"
    for event in events(a.text):
        assert isinstance(event, dict) and isinstance(event.get("type"), str), a.where
        assert not has_key(event, "timings"), a.where
        if event["type"] == "error":
            check_responses_event(event, a.where)


# Anthropic's Messages API.

_text = st.text(max_size=30)
_b64 = st.sampled_from(["iVBORw0KGgo=", "", "not base64", "R0lGODlhAQABAAAAACw="])
_image_source = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["base64", "url", "file", "x"]),
        "media_type": st.sampled_from(["image/png", "image/gif", "text/plain"]),
        "data": _b64,
    },
    optional={"url": st.sampled_from(["http://127.0.0.1:7700/", "file:///etc/passwd"])},
)
_text_block = st.fixed_dictionaries({"type": st.just("text"), "text": _text})
_block = st.one_of(
    _text_block,
    _text_block,
    _text_block,
    st.fixed_dictionaries({"type": st.just("image"), "source": _image_source}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": _text, "name": _text,
                           "input": st.dictionaries(_text, json_values, max_size=2)}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": _text},
                          optional={"content": _text | st.lists(
                              st.fixed_dictionaries({"type": st.just("text"), "text": _text}),
                              max_size=2), "is_error": st.booleans()}),
    st.fixed_dictionaries({"type": st.sampled_from(["thinking", "redacted_thinking"]),
                           "thinking": _text, "data": _text}),
)  # fmt: skip
_anthropic_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "user", "user", "assistant", "assistant", "system"]),
     "content": _text | st.lists(_block, min_size=1, max_size=3)}
)  # fmt: skip
_anthropic_tool = st.fixed_dictionaries(
    {"name": st.sampled_from(["get_weather", "x", ""]), "input_schema": st.just(
        {"type": "object", "properties": {"city": {"type": "string"}}})},
    optional={"description": _text},
)  # fmt: skip
_count_fields = {
    "system": _text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}),
                               max_size=2),
    "tools": st.lists(_anthropic_tool, max_size=2),
    "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"},
                                    {"type": "tool", "name": "get_weather"}]),
    "thinking": st.sampled_from([{"type": "enabled", "budget_tokens": 1024},
                                 {"type": "disabled"}]),
}  # fmt: skip
_models = st.sampled_from([MODEL] * 8 + ["no-such-model", ""])
# Mostly what the route takes (the mutations make the rest).
_few_tokens = st.integers(1, 8) | st.integers(1, 8) | small_ints
_unit = st.floats(0, 1) | st.floats(0, 1) | st.floats(-0.5, 1.5)
_anthropic_messages = st.lists(_anthropic_message, min_size=1, max_size=3)
count_body = near(
    st.fixed_dictionaries(
        {"model": _models, "messages": _anthropic_messages}, optional=_count_fields
    )
)
messages_body = near(
    st.fixed_dictionaries(
        {"model": _models, "messages": _anthropic_messages, "max_tokens": _few_tokens},
        optional={
            **_count_fields,
            "stream": st.booleans(),
            "stop_sequences": st.lists(st.text(max_size=5), max_size=5),
            "temperature": _unit,
            "top_p": _unit,
            "top_k": st.integers(-1, 50) | small_ints,
            "metadata": st.fixed_dictionaries({"user_id": _text}),
            "service_tier": st.sampled_from(["auto", "standard_only"]),
        },
    )
)

# The Responses API.

_part = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"]), "text": _text}),
    st.fixed_dictionaries({"type": st.just("input_image")},
                          optional={"image_url": st.sampled_from(
                              ["data:image/png;base64,iVBORw0KGgo=", "http://x/", ""]),
                              "file_id": _text, "detail": st.sampled_from(["auto", "x"])}),
    st.fixed_dictionaries({"type": st.just("input_file")},
                          optional={"file_data": st.sampled_from(
                              ["data:application/pdf;base64,JVBERi0=", "x"]),
                              "file_url": _text, "filename": _text}),
    st.fixed_dictionaries({"type": st.just("refusal"), "refusal": _text}),
)  # fmt: skip
_item = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer"]),
                           "content": _text | st.lists(_part, min_size=1, max_size=2)},
                          optional={"type": st.just("message")}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": _text, "name": _text,
                           "arguments": st.sampled_from(['{"city": "Paris"}', "{", ""])}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": _text,
                           "output": _text | st.lists(_part, max_size=2)}),
    st.fixed_dictionaries({"type": st.just("reasoning"), "summary": st.lists(
        st.fixed_dictionaries({"type": st.just("summary_text"), "text": _text}), max_size=2)}),
)  # fmt: skip
_function = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "function", "web_search"]), "name": _text,
     "parameters": st.just({"type": "object", "properties": {}})}
)  # fmt: skip
responses_body = near(
    st.fixed_dictionaries(
        {"model": _models, "input": _text | st.lists(_item, min_size=1, max_size=3)},
        optional={
            "instructions": _text,
            "stream": st.booleans(),
            "max_output_tokens": _few_tokens,
            "temperature": st.floats(0, 2) | st.floats(-0.5, 2.5),
            "top_p": _unit,
            "tools": st.lists(_function, max_size=2),
            "tool_choice": st.sampled_from(["auto", "none", "required"])
            | st.just({"type": "function", "name": "x"}),
            "parallel_tool_calls": st.booleans(),
            "text": st.sampled_from([{"format": {"type": "text"}},
                                     {"format": {"type": "json_object"}}]),
            "reasoning": st.just({"effort": "low"}),
            "metadata": st.dictionaries(st.text(max_size=6), _text, max_size=2),
            "store": st.booleans(),
            "user": _text,
        },
    )
)  # fmt: skip

# Rerank.

rerank_body = near(
    st.fixed_dictionaries(
        {"model": _models, "query": _text, "documents": st.lists(_text, min_size=1, max_size=4)},
        optional={"top_n": st.integers(1, 4) | small_ints, "return_documents": st.booleans()},
    )
)


# Transcriptions: a multipart form written by hand, so that its parts, their names, types and
# sizes, a repeated or missing field, a wrong boundary or a cut-off body can all be sent.


@dataclass
class Part:
    name: str | None
    data: bytes
    filename: str | None = None
    content_type: str | None = None


def _disposition(p: Part) -> str:
    out = "form-data"
    if p.name is not None:
        out += f'; name="{p.name}"'
    if p.filename is not None:
        out += f'; filename="{p.filename}"'
    return out


def form_body(parts: list[Part], boundary: str) -> bytes:
    """The form's bytes, each part with its head as given."""
    out = b""
    for p in parts:
        out += f"--{boundary}\r\nContent-Disposition: {_disposition(p)}\r\n".encode()
        if p.content_type is not None:
            out += f"Content-Type: {p.content_type}\r\n".encode()
        out += b"\r\n" + p.data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


WAV = b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00" + bytes(64)
_FIELDS = ["model", "file", "language", "prompt", "response_format", "temperature"]
_plain = st.text(max_size=10).filter(lambda t: not set(t) & set('"\r\n'))
_names = st.sampled_from([*_FIELDS, *_FIELDS, "timestamp_granularities[]", "stream", "", None])
_names = _names | _plain
_values = st.sampled_from(
    [MODEL.encode(), b"no-such-model", b"", b"en", b"json", b"text", b"srt", b"x", b"0.5",
     b"2", b"nan", b"\xff\xfe", b"x" * 4097, WAV]
) | st.binary(max_size=64)  # fmt: skip
_types = st.sampled_from(
    [None, "audio/wav", "audio/mpeg", "video/mp4", "text/plain", "application/octet-stream",
     "multipart/mixed; boundary=inner", "audio/" + "x" * 60]
) | header_text  # fmt: skip
_filenames = st.sampled_from([None, "a.wav", "a.mp3", "../../etc/passwd", "a", ""]) | _plain
_any_part = st.builds(Part, _names, _values, _filenames, _types)
_valid_parts = st.tuples(
    st.builds(Part, st.just("model"), st.just(MODEL.encode())),
    st.builds(Part, st.just("file"), st.just(WAV) | st.binary(max_size=300),
              st.sampled_from(["a.wav", "a.mp3"]), st.sampled_from(["audio/wav", None])),
).map(list)  # fmt: skip


@st.composite
def transcription_form(draw: st.DrawFn) -> tuple[bytes, str]:
    """(body, Content-Type): a valid form changed: parts added, dropped, repeated, moved;
    its boundary or type wrong, or its bytes cut short."""
    parts: list[Part] = draw(_valid_parts)
    parts += draw(st.lists(_any_part, max_size=3))
    for _ in range(draw(st.integers(0, 2))):
        how = draw(st.sampled_from(["drop", "repeat", "shuffle"]))
        if how == "drop" and parts:
            parts.pop(draw(st.integers(0, len(parts) - 1)))
        elif how == "repeat" and parts:
            parts.append(draw(st.sampled_from(parts)))
        else:
            parts = draw(st.permutations(parts))
    boundary = draw(st.sampled_from(["llmgwfuzz", "x" * 70, "a b", "--"]))
    body = form_body(parts, boundary)
    if draw(st.integers(0, 9)) == 0:
        body = body[: draw(st.integers(0, len(body)))]
    kind = draw(
        st.sampled_from(
            [f"multipart/form-data; boundary={boundary}"] * 6
            + ["multipart/form-data", "multipart/form-data; boundary=other",
               "application/json", f"multipart/mixed; boundary={boundary}", ""]
        )
    )  # fmt: skip
    return body, kind


# The hub's protocol at /hf.


@dataclass
class HubSet:
    """What the fuzz node's mirror holds: a set its user key may read (a model uses it) and
    one only staff may; each file's bytes by its git blob id (the ETag of its answer)."""

    visible: str
    hidden: str
    commit: str
    files: dict[str, bytes]
    by_etag: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for data in self.files.values():
            head = f"blob {len(data)}\0".encode()
            self.by_etag[f'"{hashlib.sha1(head + data).hexdigest()}"'] = data


def _segment(raw: bool) -> st.SearchStrategy[str]:
    hostile = st.sampled_from(["..", ".", "", "%2e%2e", "%2F", "a%00b", "%ff", "x" * 1100])
    made = st.text(max_size=12).map(lambda t: quote(t, safe="" if raw else "/"))
    return hostile | made


def hub_paths(hub: HubSet) -> st.SearchStrategy[str]:
    """Paths under /hf: the hub's routes with near-valid and hostile repositories, revisions,
    file paths, and others."""
    repo = st.sampled_from([hub.visible] * 5 + [hub.hidden] * 2 + ["fuzz/none", "FUZZ/SET"])
    repo = repo | st.tuples(_segment(True), _segment(True)).map("/".join)
    rev = st.sampled_from(["main"] * 3 + [hub.commit, hub.commit[:7], "refs%2Fpr%2F1",
                                          "refs/pr/1", "v1.0", "main%2F", ".."])  # fmt: skip
    rev = rev | _segment(False)
    path = st.sampled_from([*hub.files, *hub.files, "notes", "notes/", "notes/../README.md",
                            "a//b", "%5Cx", "x" * 1100]) | _segment(False)  # fmt: skip
    return st.one_of(
        st.builds("/hf/api/models/{}".format, repo),
        st.builds("/hf/api/models/{}/revision/{}".format, repo, rev),
        st.builds("/hf/api/models/{}/tree/{}".format, repo, rev),
        st.builds("/hf/api/models/{}/tree/{}/{}".format, repo, rev, path),
        st.builds("/hf/{}/resolve/{}/{}".format, repo, rev, path),
        st.builds("/hf/{}".format, _segment(False)),
    )


_flag_values = st.sampled_from(["true", "1", "false", "", "0", "True", "yes"])
_cursors = st.sampled_from(["0", "1", "2", "3", "-1", "1000", "9" * 20, "1e3", "\u0663", "0x1"])
hub_query = st.dictionaries(
    st.sampled_from(["blobs", "recursive", "cursor", "expand[]", "limit", "x"]),
    _flag_values | _cursors | st.text(max_size=20),
    max_size=3,
).map(lambda q: "?" + urlencode(q) if q else "")
_ranges = st.sampled_from(
    ["bytes=0-10", "bytes=-5", "bytes=5-", "bytes=10-5", "bytes=0-0,5-6", "BYTES=1-2",
     "bytes=" + "9" * 40 + "-", "bytes=0-" + "9" * 9000, "bytes=-" + "9" * 40,
     "bytes=0-" + "9" * 5000, "items=0-1",
     "bytes=-0", "bytes=99999-", "bytes= 1 - 2", "bytes=-"]
) | header_text  # fmt: skip


def hub_headers(hub: HubSet) -> st.SearchStrategy[list[tuple[str, str]]]:
    """Range fields (none, one or several) and an If-Range: its file's ETag or another."""
    if_range = st.sampled_from([*hub.by_etag, '"x"', 'W/"x"', "Sat, 05 Dec 2026 10:00:00 GMT"])
    return st.builds(
        lambda ranges, cond: [("Range", r) for r in ranges] + [("If-Range", c) for c in cond],
        st.lists(_ranges, max_size=3),
        st.lists(if_range | header_text, max_size=1),
    )


def check_hub_answer(a: Answer, head: bool) -> None:
    """No 5xx (the mirror holds every file), an error in the hub's shape: {"error": MESSAGE},
    X-Error-Message, and an X-Error-Code the client knows where one is given."""
    assert a.status < 500, a.where
    if a.status < 400:
        return
    assert a.headers.get("X-Error-Message"), a.where
    code = a.headers.get("X-Error-Code")
    assert code in (None, "RepoNotFound", "RevisionNotFound", "EntryNotFound"), a.where
    if not head:
        data = a.json()
        assert isinstance(data, dict) and set(data) == {"error"}, a.where
        assert isinstance(data["error"], str) and data["error"], a.where


def check_hub_bytes(a: Answer, hub: HubSet) -> None:
    """A file's bytes (or the range of them its Content-Range says) are the file's."""
    data = hub.by_etag.get(a.headers.get("ETag", ""))
    if data is None:
        return
    if a.status == 206:
        span, _, size = a.headers["Content-Range"].removeprefix("bytes ").partition("/")
        first, _, last = span.partition("-")
        assert int(size) == len(data), a.where
        data = data[int(first) : int(last) + 1]
    assert a.body == data, a.where


# SCIM.

MEDIA = "application/scim+json"
SCIM_ERROR = "urn:ietf:params:scim:api:messages:2.0:Error"
USER = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH_OP = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
SEARCH = "urn:ietf:params:scim:api:messages:2.0:SearchRequest"
SCIM_TYPES = {"invalidFilter", "tooMany", "uniqueness", "mutability", "invalidSyntax",
              "invalidPath", "noTarget", "invalidValue", "invalidVers", "sensitive"}  # fmt: skip

_attrs = st.sampled_from(
    ["userName", "USERNAME", "externalId", "active", "displayName", "emails.value", "id",
     "name.givenName", "members", f"{USER}:userName", "meta.created", "x"]
)  # fmt: skip
_filter_values = st.sampled_from(["true", "false", "null", "1", '"a\\q"', '"\\u12"']) | (
    st.text(max_size=12).map(json.dumps)
)
_ops = st.sampled_from(["eq", "EQ", "ne", "co", "sw", "pr", "gt"])
_one_filter = st.builds("{} {} {}".format, _attrs, _ops, _filter_values)
scim_filter = st.one_of(
    _one_filter,
    _one_filter,
    st.builds("{} and {}".format, _one_filter, _one_filter),
    st.builds("not ({})".format, _one_filter),
    st.integers(1, 600).map(lambda n: "(" * n + 'userName eq "a"' + ")" * n),
    st.text(max_size=40),
    st.just('userName eq "' + "a" * 1100 + '"'),
)
_paging = st.sampled_from(["1", "0", "-5", "2", "x", "1.5", "9" * 30, ""])
_attr_list = st.lists(_attrs, max_size=3).map(",".join)
scim_query = st.fixed_dictionaries(
    {},
    optional={
        "filter": scim_filter,
        "startIndex": _paging,
        "count": _paging,
        "attributes": _attr_list,
        "excludedAttributes": _attr_list,
    },
)
_emails = st.lists(
    st.fixed_dictionaries(
        {"value": st.sampled_from(["ada@example.org", "", "x" * 300]) | _text},
        optional={"type": st.sampled_from(["work", "home"]), "primary": st.booleans()
                  | st.sampled_from(["True", "false", "yes"])},
    ),
    max_size=3,
)  # fmt: skip
_user = st.fixed_dictionaries(
    {"schemas": st.just([USER]), "userName": st.from_regex(r"[a-z][a-z0-9.-]{0,15}", fullmatch=True)
     | _text},
    optional={
        "name": st.fixed_dictionaries({}, optional={"givenName": _text, "familyName": _text,
                                                    "formatted": _text}),
        "emails": _emails, "active": st.booleans() | st.sampled_from(["False", "TRUE", "no"]),
        "externalId": _text, "displayName": _text, "id": _text,
    },
)  # fmt: skip


def scim_bodies(ids: list[str]) -> dict[str, st.SearchStrategy[Any]]:
    """Near-valid bodies by kind: user, group, patch, search (ids: users' and groups' ids)."""
    members = st.lists(
        st.fixed_dictionaries({"value": st.sampled_from(ids) | _text},
                              optional={"display": _text}), max_size=3)  # fmt: skip
    group = st.fixed_dictionaries(
        {"schemas": st.just([GROUP]), "displayName": _text},
        optional={"members": members, "externalId": _text},
    )
    path = _attrs | st.sampled_from(
        ['emails[value eq "ada@example.org"]', 'members[value eq "x"]', "emails[type eq work]",
         "name.", "", "a" * 300]
    )  # fmt: skip
    op = st.fixed_dictionaries(
        {"op": st.sampled_from(["add", "replace", "remove", "Replace", "move"])},
        optional={"path": path, "value": st.booleans() | _text | members | _emails
                  | st.fixed_dictionaries({"active": st.booleans()}) | json_values},
    )  # fmt: skip
    patch = st.fixed_dictionaries(
        {"schemas": st.just([PATCH_OP]), "Operations": st.lists(op, min_size=1, max_size=3)}
    )
    search = st.builds(lambda q: {"schemas": [SEARCH], **q}, scim_query)
    return {"user": near(_user), "group": near(group), "patch": near(patch),
            "search": near(search)}  # fmt: skip


def scim_ident(ids: list[str], deleting: bool) -> st.SearchStrategy[str]:
    """A resource id for a path: one of ids (never to delete: the fuzz goes on with them),
    one of no resource, or any text (quoted)."""
    other = st.sampled_from(["aaaaaaaaaaaa", "", "..", "%2F", "x" * 300]) | st.text(
        max_size=14
    ).map(lambda t: quote(t, safe=""))
    return other if deleting else st.sampled_from(ids) | other


def quoted(query: dict[str, str]) -> str:
    """A query string, every character but letters and digits quoted."""
    return urlencode(query, quote_via=quote)


def check_scim_answer(a: Answer) -> None:
    """No 5xx; an error in SCIM's shape (RFC 7644 3.12): its media type, the schema, the
    status as a string, a detail, a known scimType where one is given."""
    assert a.status < 500, a.where
    if a.status < 400:
        if a.status != 204:
            assert isinstance(a.json().get("schemas"), list), a.where
        return
    assert a.content_type.startswith("application/scim+json"), a.where
    data = a.json()
    assert isinstance(data, dict) and set(data) <= {"schemas", "status", "detail", "scimType"}
    assert data["schemas"] == [SCIM_ERROR] and data["status"] == str(a.status), a.where
    assert isinstance(data["detail"], str) and data["detail"], a.where
    assert data.get("scimType", "invalidValue") in SCIM_TYPES, a.where
