"""What a client may send on each /v1 route: an allow-list of fields with their types and ranges;
anything else is refused with a 400 naming it, before the request reaches an engine."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar, get_args

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from llmgwd.catalog import Model
from llmgwd.router import errors

Document = dict[str, Any]

INT32_MAX = 2**31 - 1  # engines read counts as int32: a larger one wraps
# The most completions one request makes: n (or best_of) times its prompts. OpenAI allows n up
# to 128, but each completion runs in an engine slot of its own (llama-server has 4 a replica
# by default, and refuses an n above its slots) and is reserved whole against the key's
# tokens: 16 covers best-of sampling and small batches without one request taking the slots of
# several replicas.
MAX_CHOICES = 16
MAX_INPUTS = 2048  # texts in one embeddings request, as OpenAI allows
MAX_STOP = 4  # stop sequences, as OpenAI allows
MAX_TOOLS = 128  # as OpenAI allows
MAX_LOGIT_BIAS = 300  # tokens biased in one request
_BASE64 = re.compile(r"[A-Za-z0-9+/=_\-\s]*")  # base64, standard or URL-safe, maybe wrapped

# OpenAI fields the engines have nothing for: refused with that said, not as unknown.
UNSUPPORTED = frozenset({"audio", "modalities", "prediction", "web_search_options", "functions",
                         "function_call"})  # fmt: skip
# OpenAI fields an engine refuses whenever they are there (with a 500): engine -> route -> field
# -> its default, which is dropped rather than refused.
ENGINE_LACKS: dict[str, dict[str, dict[str, object]]] = {
    "llama.cpp": {"completions": {"best_of": 1, "suffix": "", "echo": False}}
}

Count = Annotated[int, Meta(ge=1, le=INT32_MAX)]
Choices = Annotated[int, Meta(ge=1, le=MAX_CHOICES)]
Text = Annotated[str, Meta(min_length=1)]
Unit = Annotated[float, Meta(ge=0, le=1)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]
Temperature = Annotated[float, Meta(ge=0, le=2)]
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
TopK = Annotated[int, Meta(ge=-1, le=INT32_MAX)]  # -1 or 0: off (vLLM's and llama.cpp's)
RepeatPenalty = Annotated[float, Meta(ge=0, le=10)]
Stop = str | Annotated[list[str], Meta(max_length=MAX_STOP)]
LogitBias = Annotated[
    dict[str, Annotated[float, Meta(ge=-100, le=100)]], Meta(max_length=MAX_LOGIT_BIAS)
]
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
ToolChoiceMode = Literal["none", "auto", "required"]
FormatType = Literal["text", "json_object", "json_schema"]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]
Object = dict[str, Any]
R = TypeVar("R", bound=Struct)


class StreamOptions(Struct):
    include_usage: bool | None = None


class Sampling(Struct, forbid_unknown_fields=True, kw_only=True):
    """Fields both completion routes take: OpenAI's, and sampling extras engines share that
    change neither how much is generated, nor the slot used, nor what the engine tells of its
    internals (top_k, min_p, typical_p, repeat_penalty)."""

    model: Text
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: Count | None = None
    temperature: Temperature | None = None
    top_p: Unit | None = None
    n: Choices | None = None
    stop: Stop | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    seed: Seed | None = None
    user: str | None = None
    top_k: TopK | None = None
    min_p: Unit | None = None
    typical_p: Unit | None = None
    repeat_penalty: RepeatPenalty | None = None


class TextPart(Struct, tag_field="type", tag="text"):
    text: str


class ImagePart(Struct, tag_field="type", tag="image_url"):
    image_url: ImageUrl


class ImageUrl(Struct):
    url: str
    detail: str | None = None


class AudioPart(Struct, tag_field="type", tag="input_audio"):
    input_audio: InputAudio


class InputAudio(Struct, forbid_unknown_fields=True):
    """Audio inline: base64 data (or a data: URL), never a link (an engine reads `url` too)."""

    data: str
    format: str | None = None


Content = str | list[TextPart | ImagePart | AudioPart] | None


class FunctionCall(Struct):
    name: str
    arguments: str | Object


class ToolCall(Struct):
    type: Literal["function"]
    function: FunctionCall
    id: str | None = None


class Message(Struct):
    """One message; fields other than these pass (clients resend answers' fields, as refusal)."""

    role: Role
    content: Content | UnsetType = UNSET
    name: str | UnsetType = UNSET
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET


class Function(Struct):
    name: Text
    description: str = ""
    parameters: Object | None = None
    strict: bool | None = None


class Tool(Struct):
    type: Literal["function"]
    function: Function


class NamedFunction(Struct):
    name: Text


class ToolChoice(Struct):
    type: Literal["function"]
    function: NamedFunction


class ResponseFormat(Struct):
    type: FormatType
    json_schema: Object | None = None


class ChatRequest(Sampling, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Message], Meta(min_length=1)]
    max_completion_tokens: Count | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoiceMode | ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: ReasoningEffort | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None


class CompletionRequest(Sampling, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/completions: prompt is checked further by inputs()."""

    prompt: str | Annotated[list[Any], Meta(min_length=1)]
    suffix: str | None = None
    echo: bool | None = None
    best_of: Choices | None = None
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None


class EmbeddingRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/embeddings: input is checked further by inputs()."""

    model: Text
    input: str | Annotated[list[Any], Meta(min_length=1, max_length=MAX_INPUTS)]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Count | None = None
    user: str | None = None
    stream: bool | None = None  # refused when true, by the embeddings route


def chat(doc: Document) -> str:
    """Check a chat request; returns its model's name."""
    request = _convert(doc, ChatRequest)
    for i, message in enumerate(request.messages):
        if message.content is UNSET and not (message.role == "assistant" and message.tool_calls):
            raise errors.missing_parameter(f"messages[{i}].content")
        _inline_images(message, f"messages[{i}].content")
    if request.top_logprobs is not None and request.logprobs is not True:
        raise errors.invalid_value("top_logprobs", "'top_logprobs' requires 'logprobs' to be true.")
    return request.model


def _inline_images(message: Message, param: str) -> None:
    """Refuse an image or audio given by URL: the engine would fetch it from the node, so a
    request body would choose where the cluster connects. Only inline data passes."""
    if not isinstance(message.content, list):
        return
    for j, part in enumerate(message.content):
        if isinstance(part, ImagePart):
            inline_url(part.image_url.url, f"{param}[{j}].image_url.url", "images")
        elif isinstance(part, AudioPart):
            inline_data(part.input_audio.data, f"{param}[{j}].input_audio.data", "audio")


def inline_url(url: str, param: str, what: str) -> None:
    """400 unless url is a data: URL (what: "images", "files", as the message names them)."""
    if not url.startswith("data:"):
        message = (f"'{param}' is not a data: URL: {what} must be sent inline as data: URLs "
                   "(base64), never as links.")  # fmt: skip
        raise errors.invalid_value(param, message)


def inline_data(data: str, param: str, what: str) -> None:
    """400 unless data is base64 or a data: URL (engines read anything else as a link)."""
    linked = data.startswith("http") or _BASE64.fullmatch(data) is None  # llama.cpp: "http..."
    if not data.startswith("data:") and linked:
        message = (f"'{param}' is not base64 data: {what} must be sent inline as base64 or a "
                   "data: URL, never as links.")  # fmt: skip
        raise errors.invalid_value(param, message)


def refuse_link(param: str, what: str, how: str) -> errors.ApiError:
    """The 400 for content given by a link or a stored file's id (param), which the router
    never lets an engine fetch; how: what to send instead."""
    message = (f"'{param}' is not supported: {what} must be sent inline ({how}), never as "
               "links or stored files' ids.")  # fmt: skip
    return errors.invalid_value(param, message)


def completion(doc: Document) -> str:
    """Check a completions request, its number of completions too; returns its model's name."""
    request = _convert(doc, CompletionRequest)
    prompts = inputs("prompt", request.prompt)
    n = request.n or 1
    best_of = request.best_of or n
    if best_of < n:
        raise errors.invalid_value("best_of", f"'best_of' ({best_of}) must be at least 'n' ({n}).")
    if prompts > MAX_CHOICES:
        message = f"'prompt' holds {prompts} prompts: at most {MAX_CHOICES} are taken at once."
        raise errors.invalid_value("prompt", message)
    if prompts * best_of > MAX_CHOICES:
        message = (f"{prompts} prompts times {best_of} completions each is more than the "
                   f"{MAX_CHOICES} completions one request may make.")  # fmt: skip
        raise errors.invalid_value("best_of" if request.best_of else "n", message)
    return request.model


def embedding(doc: Document) -> EmbeddingRequest:
    """Check an embeddings request's fields (the route checks the rest)."""
    request = _convert(doc, EmbeddingRequest)
    inputs("input", request.input)
    return request


def inputs(param: str, value: str | list[Any]) -> int:
    """How many prompts value is: a text, or an array of texts, of token ids (one prompt) or of
    arrays of token ids; its elements all of one kind."""
    if isinstance(value, str):
        return 1
    kind = _kind(value[0], f"{param}[0]")
    for i, item in enumerate(value):
        if _kind(item, f"{param}[{i}]") != kind:
            message = f"'{param}[{i}]' is not {kind} as '{param}[0]' is: do not mix them."
            raise errors.invalid_value(f"{param}[{i}]", message)
    return 1 if kind == "an integer" else len(value)


def prompts(doc: Document) -> int:
    """How many prompts a checked request has (a chat's messages are one)."""
    prompt = doc.get("prompt")
    return 1 if prompt is None else inputs("prompt", prompt)


def for_engine(doc: Document, model: Model, route: str) -> None:
    """Refuse what the model's engine lacks of OpenAI's fields; drop those left at defaults."""
    for name, default in ENGINE_LACKS.get(model.engine, {}).get(route, {}).items():
        value = doc.pop(name, None)
        if value is not None and (type(value) is not type(default) or value != default):
            message = (f"The model '{errors.quote(model.name)}' runs on {model.engine}, "
                       f"which does not support '{name}'.")  # fmt: skip
            raise errors.unsupported_parameter(name, message)


def _kind(item: object, param: str) -> str:
    """What one element of an input array is: a text, a token id or an array of token ids."""
    if isinstance(item, str):
        return "a string"
    if _is_token(item, param):
        return "an integer"
    if isinstance(item, list) and all(_is_token(t, param) for t in item):
        return "an array of integers"
    raise errors.invalid_type(param, "a string, an integer or an array of integers", item)


def _is_token(item: object, param: str) -> bool:
    if not isinstance(item, int) or isinstance(item, bool):
        return False
    if not 0 <= item <= INT32_MAX:
        raise errors.invalid_value(param, f"'{param}' holds {item}, which is no token id.")
    return True


# msgspec's refusal, in OpenAI's words.

_MESSAGE = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]*)`$")
_TYPE = re.compile(r"^Expected `(?P<expected>[^`]*)`, got `[^`]*`$")
_RANGE = re.compile(r"^Expected `(?P<type>[^`]*)` (?P<rule>.*)$")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\.\.\.\]")
_TYPE_NAMES = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean",
               "array": "an array", "object": "an object", "null": "null"}  # fmt: skip
Values = dict[str, tuple[str, ...]]
_CHOICES: Values = {  # the values a field takes, by its path with the indices left out
    "messages[].role": get_args(Role),
    "messages[].content[].type": ("text", "image_url", "input_audio"),
    "messages[].tool_calls[].type": ("function",),
    "tools[].type": ("function",),
    "tool_choice": get_args(ToolChoiceMode),
    "tool_choice.type": ("function",),
    "response_format.type": get_args(FormatType),
    "reasoning_effort": get_args(ReasoningEffort),
    "encoding_format": ("float", "base64"),
}


def checked(doc: Document, kind: type[R], choices: Values | None = None) -> R:
    """doc as kind (an allow-list of fields), or the 400 that names what is wrong; choices:
    the values a field of the route takes, by its path without indices (as _CHOICES)."""
    return _convert(doc, kind, _CHOICES if choices is None else choices)


def _convert(doc: Document, kind: type[R], choices: Values = _CHOICES) -> R:
    try:
        return msgspec.convert(doc, kind)
    except msgspec.ValidationError as e:
        raise _refusal(str(e), doc, choices) from None


def _refusal(text: str, doc: Document, choices: Values) -> errors.ApiError:
    """msgspec's "Expected `int` <= 20 - at `$.top_logprobs`" as an ApiError naming the param."""
    match = _MESSAGE.match(text)
    assert match is not None  # the pattern matches any text
    what, path = match["what"], match["path"] or ""
    param = _param(path)
    if m := _UNKNOWN.match(what):
        name = _join(param, m["name"])
        if not param and name in UNSUPPORTED:
            return errors.unsupported_parameter(name, f"'{name}' is not supported here.")
        return errors.unknown_parameter(name)
    if m := _MISSING.match(what):
        return errors.missing_parameter(_join(param, m["name"]))
    value = _value_at(doc, path)
    if m := _TYPE.match(what):
        names = [_TYPE_NAMES.get(t, t) for t in m["expected"].split(" | ") if t != "null"]
        return errors.invalid_type(param, " or ".join(names), value)
    if m := _RANGE.match(what):
        got = f", got {value}" if isinstance(value, int | float) else ""
        rule = f"{_TYPE_NAMES.get(m['type'], m['type'])} {m['rule']}{got}"
        return errors.invalid_value(param, f"Invalid value for '{param}': expected {rule}.")
    message = f"Invalid value for '{param}'"
    if isinstance(value, str):
        message += f": '{errors.quote(value)}'"
    values = choices.get(re.sub(r"\[\d+\]", "[]", param))
    if values:
        message += ". Supported values are: " + ", ".join(f"'{c}'" for c in values)
    return errors.invalid_value(param, message + ".")


def _param(path: str) -> str:
    """`.messages[0].role` as OpenAI names it, messages[0].role; a map's values by the map."""
    return path.split("[...]")[0].removeprefix(".")


def _join(param: str, name: str) -> str:
    return f"{param}.{name}" if param else name


def _value_at(doc: Document, path: str) -> object:
    """The value at a msgspec path in the body (a map's values: the map)."""
    value: object = doc
    for key, index in _STEP.findall(path):
        if isinstance(value, dict) and key:
            value = value.get(key)
        elif isinstance(value, list) and index:
            value = value[int(index)]
        else:
            break
    return value
