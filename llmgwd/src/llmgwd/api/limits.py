"""/api/v1's limits and prices: a key's limits, a model's price."""

from __future__ import annotations

import logging

from aiohttp import web

from llmgw.api_types import LimitsIn, PriceIn
from llmgwd.accounting import views
from llmgwd.api.base import api_context, caller, checked, json_response, not_found, read_body
from llmgwd.api.keys import _find_key, key_view
from llmgwd.api.models import _model_or_404, _view
from llmgwd.catalog import CatalogError

log = logging.getLogger(__name__)


async def set_key_limits(request: web.Request) -> web.Response:
    """PATCH /keys/{key}/limits: change the limits given, keep the others (0 removes one)."""
    ctx = api_context(request)
    key = _find_key(ctx, request.match_info["key"])
    limits = checked(views.apply_limits, key.limits, await read_body(request, LimitsIn))
    try:
        key = await ctx.catalog.set_key_limits(key.id, limits)
    except CatalogError:
        raise not_found("key", key.id) from None
    log.info("key %s (%s) limits set to %s by %s", key.id, key.name, limits, caller(request))
    return json_response(key_view(key))


async def set_price(request: web.Request) -> web.Response:
    """PUT /models/{name}/price {prompt, completion}: per million tokens."""
    ctx = api_context(request)
    name = request.match_info["name"]
    _model_or_404(ctx, name)
    body = await read_body(request, PriceIn)
    checked(views.check_price, body)
    try:
        model = await ctx.catalog.update_model(
            name, price_prompt=body.prompt, price_completion=body.completion
        )
    except CatalogError:
        raise not_found("model", name) from None
    log.info("model %s priced %s/%s by %s", name, body.prompt, body.completion, caller(request))
    return json_response(_view(ctx, model))
