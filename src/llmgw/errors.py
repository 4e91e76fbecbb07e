"""One error contract: ApiError and its one body, rendered in each route's shape."""

from __future__ import annotations

import json
from collections.abc import Mapping

import msgspec
from aiohttp import web

from llmgw.api_types.common import ErrorAnswer, ErrorBody

__all__ = [
    "ANTHROPIC",
    "API_V1",
    "HF",
    "OPENAI",
    "RESPONSES",
    "SCIM",
    "ApiError",
    "ClusterError",
    "ErrorAnswer",
    "ErrorBody",
    "ErrorDetail",
    "OpenAIErrorAnswer",
    "Shape",
    "cluster_error",
]


_JSON = "application/json"


class ErrorDetail(msgspec.Struct, omit_defaults=False):
    """An error's one body (OpenAI's inner object), which every shape renders."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorAnswer(msgspec.Struct):
    """OpenAI's error answer: {"error": {...}}."""

    error: ErrorDetail


class Shape:
    """How an error is written on one family of routes; this one: OpenAI's (/v1)."""

    own_codes = False  # True: the shape's codes are its own words (SCIM's scimType, the hub's)

    def body(self, error: ApiError) -> bytes:
        """The JSON body of an answer that has not begun."""
        return msgspec.json.encode(OpenAIErrorAnswer(error.detail))

    def event(self, error: ApiError) -> bytes:
        """The last event of a stream that already began."""
        return b"data: " + self.body(error) + b"\n\n"

    def response(self, error: ApiError) -> web.Response:
        """A complete answer (ApiError.response writes OpenAI's itself, the hot path's)."""
        return web.Response(
            status=error.status,
            body=self.body(error),
            content_type="application/json",
            headers=error.headers,
        )


class ApiError(Exception):
    """A failure the client is told about: status, detail (message, type, param, code) and
    headers, written in its shape (OpenAI's unless reshaped)."""

    shape: Shape  # set at the end of this module: OPENAI
    sequence_number = 0  # the Responses API's: the stream's events before it, where known

    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        code: str | None = None,
        param: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.detail = ErrorDetail(message=message, type=type_, param=param, code=code)
        self.headers = dict(headers or {})

    def reshaped(self, shape: Shape) -> ApiError:
        """This error in shape (a copy unless already so), its status, detail and headers kept."""
        if self.shape is shape:
            return self
        d = self.detail
        code = None if shape.own_codes else d.code  # an OpenAI code is no scimType
        out = ApiError(self.status, d.message, d.type, code, d.param, headers=self.headers)
        out.shape = shape
        return out

    def body(self) -> bytes:
        """The JSON body of this error, in its shape."""
        return self.shape.body(self)

    def response(self) -> web.Response:
        """This error as a complete HTTP response, in its shape."""
        shape = self.shape
        if shape is not OPENAI:
            return shape.response(self)
        return web.Response(
            status=self.status,
            body=shape.body(self),
            content_type="application/json",
            headers=self.headers,
        )

    def sse_event(self) -> bytes:
        """This error as the last event of a stream that already began, in its shape."""
        return self.shape.event(self)


# Anthropic's error type for each status; another 5xx is an api_error.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    499: "invalid_request_error",
    503: "overloaded_error",
    504: "timeout_error",
}


class _Anthropic(Shape):
    """Anthropic's (/v1/messages): {"type": "error", "error": {"type": ..., "message": ...}}."""

    def body(self, error: ApiError) -> bytes:
        other = "api_error" if error.status >= 500 else "invalid_request_error"
        kind = _ANTHROPIC_TYPES.get(error.status, other)
        inner = {"type": kind, "message": error.detail.message}
        return msgspec.json.encode({"type": "error", "error": inner})

    def event(self, error: ApiError) -> bytes:
        return b"event: error\ndata: " + self.body(error) + b"\n\n"


class _ResponsesEvent(msgspec.Struct):
    """The Responses API's error event (openai's ResponseErrorEvent)."""

    code: str | None
    message: str
    param: str | None
    sequence_number: int
    type: str = "error"


class _Responses(Shape):
    """The Responses API's: OpenAI's body before a stream began, its `error` event after."""

    def event(self, error: ApiError) -> bytes:
        d = error.detail
        event = _ResponsesEvent(d.code or d.type, d.message, d.param, error.sequence_number)
        return b"event: error\ndata: " + msgspec.json.encode(event) + b"\n\n"


class _ApiV1(Shape):
    """/api/v1's: ErrorAnswer, {"error": {"message", "type", "code", "param"?}}."""

    def body(self, error: ApiError) -> bytes:
        d = error.detail
        inner = ErrorBody(d.message, d.type, d.code or d.type, d.param)
        return msgspec.json.encode(ErrorAnswer(inner))

    def response(self, error: ApiError) -> web.Response:
        out = web.Response(status=error.status, body=self.body(error), content_type=_JSON)
        out.headers.update(error.headers)
        return out


SCIM_ERROR = "urn:ietf:params:scim:api:messages:2.0:Error"
SCIM_MEDIA = "application/scim+json"


class _Scim(Shape):
    """SCIM's (RFC 7644 3.12): {"schemas": [...Error], "status": "400", "detail": MESSAGE,
    "scimType"?: CODE}, as application/scim+json."""

    own_codes = True

    def body(self, error: ApiError) -> bytes:
        d = error.detail
        doc: dict[str, object] = {"schemas": [SCIM_ERROR], "status": str(error.status)}
        doc["detail"] = d.message
        if d.code:
            doc["scimType"] = d.code
        return json.dumps(doc).encode()

    def response(self, error: ApiError) -> web.Response:
        body = self.body(error).decode()
        out = web.Response(status=error.status, text=body, content_type=SCIM_MEDIA)
        if error.status == 401:
            out.headers["WWW-Authenticate"] = 'Bearer realm="llmgw-scim"'
        out.headers.update(error.headers)
        return out


# The hub's answer to a key it does not accept; the client shows it as such (not "repo not found").
_BAD_CREDENTIALS = "Invalid credentials in Authorization header"


class _Hub(Shape):
    """The Hugging Face hub's (/hf): {"error": MESSAGE}, with X-Error-Message (and
    X-Error-Code) headers, which its client reads."""

    own_codes = True

    def body(self, error: ApiError) -> bytes:
        return json.dumps({"error": error.detail.message}).encode()

    def response(self, error: ApiError) -> web.Response:
        d = error.detail
        message = _BAD_CREDENTIALS if error.status == 401 else d.message
        headers = error.headers | {"X-Error-Message": _header_safe(message)}
        if d.code:
            headers["X-Error-Code"] = d.code
        return web.json_response({"error": d.message}, status=error.status, headers=headers)


def _header_safe(text: str) -> str:
    """Text fit for a header: printable ASCII (others escaped)."""
    text = text.encode("ascii", "backslashreplace").decode("ascii")
    return "".join(c if c.isprintable() else "?" for c in text)


OPENAI = Shape()
ANTHROPIC = _Anthropic()
RESPONSES = _Responses()
API_V1 = _ApiV1()
SCIM = _Scim()
HF = _Hub()
ApiError.shape = OPENAI


class ClusterError(msgspec.Struct, omit_defaults=True):
    """The cluster port's error body: {"error": MESSAGE, "code"?: CODE}."""

    error: str
    code: str = ""


def cluster_error(status: int, message: str, code: str = "") -> web.Response:
    """A cluster port's error answer (its bytes as aiohttp's json_response writes them)."""
    return web.json_response(msgspec.to_builtins(ClusterError(message, code)), status=status)
