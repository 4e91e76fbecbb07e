"""/api/v1's error body and some of its requests and answers: one definition for llmgwd and
the llmgw command (the rest are still llmgwd's own, in llmgwd/api/)."""

from __future__ import annotations

import msgspec


class ErrorBody(msgspec.Struct, omit_defaults=True):
    """The body of an error answer."""

    message: str
    type: str
    code: str
    param: str | None = None  # the request field at fault, for a 400


class ErrorAnswer(msgspec.Struct):
    """Every /api/v1 error answer: {"error": {"message", "type", "code", "param"?}}."""

    error: ErrorBody


class TokenView(msgspec.Struct, kw_only=True):
    """POST /tokens: a new join token and the command that uses it."""

    token: str
    expires_in: int
    url: str
    command: str


class NodeFlagsView(msgspec.Struct, kw_only=True):
    """POST /nodes/{name}/cordon|drain|uncordon: what the node's flags are now."""

    name: str
    cordoned: bool
    draining: bool
