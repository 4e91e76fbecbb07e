"""/api/v1's external providers: a model served by an upstream API, as staff add it and as
it is shown (never its credential)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from llmgw.api_types.common import Name
from llmgw.api_types.models import Context

ProviderProtocol = Literal["openai", "anthropic"]
# https://, or http:// on the loopback only: the credential is sent with every request.
URL_PATTERN = (
    r"^(https://[^\s/?#@]+|http://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]{1,5})?)(/[^\s?#]*)?$"
)
URL_RULE = (
    "must be https://HOST[:PORT][/PATH] (http:// on the loopback only), no user, query or "
    "fragment, not a link-local address"
)
# The upstream's own model name: what its API calls it (OpenAI's and Anthropic's are ASCII).
UpstreamModel = Annotated[str, msgspec.Meta(pattern=r"^[\x21-\x7e]{1,200}$")]
Credential = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]


class ProviderIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /api/v1/providers: a model of the catalog served by an upstream API."""

    name: Name  # the catalog's name, which clients ask for
    protocol: ProviderProtocol
    url: Annotated[str, msgspec.Meta(pattern=URL_PATTERN, description=URL_RULE)]  # its /v1
    model: UpstreamModel
    credential: Credential  # sealed at rest; never logged, shown or returned
    context: Context = 0  # the upstream model's context, for the router's bounds (0: unknown)
    max_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0


class ProviderView(msgspec.Struct, kw_only=True):
    """An external provider's model: where it is served from, never its credential."""

    name: str
    protocol: ProviderProtocol
    url: str
    model: str
    context: int
    max_tokens: int
    price_prompt: float
    price_completion: float
    created_at: float


class ProviderRemoved(msgspec.Struct, kw_only=True):
    """DELETE /api/v1/providers/{name}"""

    name: str
    removed: bool
