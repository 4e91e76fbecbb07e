"""One error contract: ApiError and its one body, rendered in each route's shape."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from aiohttp import web

from llmgw.api_types.common import ErrorAnswer, ErrorBody

__all__ = [
    "ANTHROPIC",
    "API_V1",
    "OPENAI",
    "RESPONSES",
    "ApiError",
    "ClusterError",
    "ErrorAnswer",
    "ErrorBody",
    "ErrorDetail",
    "OpenAIErrorAnswer",
    "Shape",
    "cluster_error",
    "hub_body",
    "scim_body",
]


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

    def body(self, error: ApiError) -> bytes:
        """The JSON body of an answer that has not begun."""
        return msgspec.json.encode(OpenAIErrorAnswer(error.detail))

    def event(self, error: ApiError) -> bytes:
        """The last event of a stream that already began."""
        return b"data: " + self.body(error) + b"\n\n"


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
        out = ApiError(self.status, d.message, d.type, d.code, d.param, headers=self.headers)
        out.shape = shape
        return out

    def body(self) -> bytes:
        """The JSON body of this error, in its shape."""
        return self.shape.body(self)

    def response(self) -> web.Response:
        """This error as a complete HTTP response, in its shape."""
        return web.Response(
            status=self.status,
            body=self.shape.body(self),
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
        return msgspec.json.encode(
            ErrorAnswer(ErrorBody(d.message, d.type, d.code or d.type, d.param))
        )


OPENAI = Shape()
ANTHROPIC = _Anthropic()
RESPONSES = _Responses()
API_V1 = _ApiV1()
ApiError.shape = OPENAI


def scim_body(status: int, detail: str, scim_type: str, error_urn: str) -> dict[str, object]:
    """RFC 7644 3.12's error document (SCIM's shape)."""
    doc: dict[str, object] = {"schemas": [error_urn], "status": str(status), "detail": detail}
    if scim_type:
        doc["scimType"] = scim_type
    return doc


def hub_body(message: str) -> dict[str, str]:
    """The Hugging Face hub's error body, {"error": MESSAGE} (its headers say the rest)."""
    return {"error": message}


class ClusterError(msgspec.Struct, omit_defaults=True):
    """The cluster port's error body: {"error": MESSAGE, "code"?: CODE}."""

    error: str
    code: str = ""


def cluster_error(status: int, message: str, code: str = "") -> web.Response:
    """A cluster port's error answer (its bytes as aiohttp's json_response writes them)."""
    return web.json_response(msgspec.to_builtins(ClusterError(message, code)), status=status)
