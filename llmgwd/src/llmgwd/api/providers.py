"""/api/v1's external providers: a model of the catalog served by an upstream API, added by
staff with its URL, upstream model name and credential (sealed at rest, never shown)."""

from __future__ import annotations

import logging

from aiohttp import web

from llmgw.api_types import ProviderIn, ProviderRemoved, ProviderView
from llmgw.errors import ApiError
from llmgwd.api.access import private_path
from llmgwd.api.base import api_context, bad_field, caller, json_response, not_found, read_body
from llmgwd.api.models import NAME_RE
from llmgwd.catalog import CatalogError, Model, ModelUpstream
from llmgwd.providers.addresses import url_refusal

log = logging.getLogger(__name__)


def provider_view(model: Model) -> ProviderView:
    """What is shown of a provider's model: never its credential, sealed or not."""
    assert model.upstream is not None
    up = model.upstream
    return ProviderView(
        name=model.name,
        protocol=up.protocol,
        url=up.url,
        model=up.model,
        context=model.context,
        max_tokens=model.max_tokens,
        price_prompt=model.price_prompt,
        price_completion=model.price_completion,
        created_at=model.created_at,
    )


def _model_of(body: ProviderIn, sealed: str) -> Model:
    if not NAME_RE.fullmatch(body.name):
        raise bad_field("name", "must be 1-64 of a-z 0-9 . _ - and start with a letter or digit")
    if not 0 <= body.max_tokens <= (body.context or body.max_tokens):
        raise bad_field("max_tokens", "must be between 0 (the context) and the context")
    if any(c in body.credential for c in "\r\n\0"):
        raise bad_field("credential", "holds a line break or a NUL")  # never quoted
    url = body.url.rstrip("/")
    if (why := url_refusal(url)) is not None:
        raise bad_field("url", why)
    upstream = ModelUpstream(protocol=body.protocol, url=url, model=body.model, credential=sealed)
    return Model(
        name=body.name,
        source=f"upstream:{url}",
        context=body.context,
        max_tokens=body.max_tokens,
        upstream=upstream,
    )


async def add_provider(request: web.Request) -> web.Response:
    """POST /providers: a model served by an upstream API, its credential sealed; the
    credential taken only over TLS, the Unix socket or loopback, never plain http://."""
    ctx = api_context(request)
    if not private_path(request):
        raise ApiError(
            403,
            "a provider's credential is sent in the request: add it over https:// (or on the "
            "control plane's Unix socket), not plain http://",
            "permission_error",
            "tls_required",
        )
    if ctx.credentials is None:
        raise ApiError(503, "this llmgwd cannot seal credentials", "server_error")
    body = await read_body(request, ProviderIn)
    model = _model_of(body, ctx.credentials.seal(body.name, body.credential))
    try:
        model = await ctx.catalog.add_model(model)
    except CatalogError as e:
        raise ApiError(409, str(e), "conflict_error", "model_exists") from None
    log.info(
        "model %s added (%s upstream %s, model %s) by %s",
        model.name, body.protocol, model.source, body.model, caller(request),
    )  # fmt: skip
    return json_response(provider_view(model), 201)


async def list_providers(request: web.Request) -> web.Response:
    """GET /providers: the catalog's models served by an upstream API."""
    ctx = api_context(request)
    views = [provider_view(m) for m in ctx.catalog.all() if m.upstream is not None]
    return json_response(sorted(views, key=lambda v: v.name))


async def remove_provider(request: web.Request) -> web.Response:
    """DELETE /providers/{name}: the provider's model out of the catalog, credential too."""
    ctx = api_context(request)
    name = request.match_info["name"]
    model = ctx.catalog.get(name)
    if model is None or model.upstream is None:
        raise not_found("provider", name)
    try:
        await ctx.catalog.remove_model(name)
    except CatalogError:
        raise not_found("provider", name) from None
    log.info("model %s (an external provider's) removed by %s", name, caller(request))
    return json_response(ProviderRemoved(name=name, removed=True))
