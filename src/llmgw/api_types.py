"""/api/v1's error body and some of its requests and answers: one definition for llmgwd and
the llmgw command (the rest are still llmgwd's own, in llmgwd/api/)."""

from __future__ import annotations

from typing import Annotated

import msgspec

# The checks a handler makes on a request's fields, said in the types so that the OpenAPI
# document states them (and msgspec refuses a body that breaks them, naming the field).
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
Name = Annotated[
    str, msgspec.Meta(pattern=NAME_PATTERN, description="1-64 of a-z 0-9 . _ -, not . _ - first")
]
Email = Annotated[
    str, msgspec.Meta(pattern=r"^(|[^@\s]{1,64}@[^@\s]{1,255})$", description="name@domain")
]
Title = Annotated[str, msgspec.Meta(max_length=200)]


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


class OidcInfo(msgspec.Struct, kw_only=True):
    """GET /login/oidc: what `llmgw login` needs to send a person to the provider."""

    issuer: str
    authorization_endpoint: str
    client_id: str
    scopes: list[str]


class OidcLogin(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /login/oidc: a sign-in's code (with its PKCE verifier and redirect), which llmgwd
    trades for the ID token, or the ID token itself; the nonce sent to the provider."""

    nonce: str
    code: str = ""
    code_verifier: str = ""
    redirect_uri: str = ""
    id_token: str = ""


class LoginAnswer(msgspec.Struct, kw_only=True):
    """POST /login/oidc: the signed-in user and their session's key (shown once)."""

    user: str  # the user's id
    name: str
    key: str
    expires_at: float
