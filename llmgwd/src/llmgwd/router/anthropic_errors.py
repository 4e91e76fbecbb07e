"""Errors on Anthropic's routes (/v1/messages...) in Anthropic's shape,
{"type": "error", "error": {"type": ..., "message": ...}}, and its x-api-key header."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
from aiohttp import web

from llmgwd.router import errors

# Anthropic's error type for each status; another 5xx is an api_error.
_TYPES = {
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


class AnthropicError(errors.ApiError):
    """An ApiError whose body and stream event are in Anthropic's shape."""

    def body(self) -> bytes:
        """{"type": "error", "error": {"type": ..., "message": ...}}."""
        other = "api_error" if self.status >= 500 else "invalid_request_error"
        kind = _TYPES.get(self.status, other)
        error = {"type": kind, "message": self.detail.message}
        return msgspec.json.encode({"type": "error", "error": error})

    def sse_event(self) -> bytes:
        """Anthropic's error event, the last of a stream that already began."""
        return b"event: error\ndata: " + self.body() + b"\n\n"


def shaped(error: errors.ApiError) -> AnthropicError:
    """error in Anthropic's shape (its status, headers and OpenAI code kept for the log)."""
    return error.reshaped(AnthropicError)


@contextmanager
def anthropic_shape() -> Iterator[None]:
    """Every ApiError raised in the block leaves it in Anthropic's shape."""
    try:
        yield
    except errors.ApiError as e:
        raise shaped(e) from None


def api_key_header(request: web.Request) -> str:
    """'Bearer KEY' from Anthropic's x-api-key header on its routes, else ""."""
    secret = request.headers.get("x-api-key", "").strip()
    if secret and request.path.startswith("/v1/messages"):
        return f"Bearer {secret}"
    return ""
