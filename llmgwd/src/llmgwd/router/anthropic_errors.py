"""Errors on Anthropic's routes (/v1/messages...) in Anthropic's shape (llmgw.errors.ANTHROPIC),
and its x-api-key header."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from llmgw.errors import ANTHROPIC
from llmgwd.router import errors


def shaped(error: errors.ApiError) -> errors.ApiError:
    """error in Anthropic's shape (its status, headers and OpenAI code kept for the log)."""
    return error.reshaped(ANTHROPIC)


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
