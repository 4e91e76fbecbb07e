"""/api/v1's stored bearer tokens, each shown once and replacing the old one: SCIM's, for the
identity provider's /scim/v2, and the scrape token, for Prometheus' /metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web

from llmgw.api_types import MetricsTokenView, ScimTokenView
from llmgwd.api.access import RouteHandler
from llmgwd.api.base import api_context, caller, json_response
from llmgwd.metrics import endpoint
from llmgwd.scim import token
from llmgwd.stored_token import StoredToken

log = logging.getLogger(__name__)


def minting(kind: StoredToken, what: str, view: Callable[[str], object]) -> RouteHandler:
    """A POST route making a new token of kind, the old one stopping, its secret in view."""

    async def create(request: web.Request) -> web.Response:
        secret = await kind.mint(api_context(request).catalog.store)
        log.info("a new %s token made by %s (the old one stops)", what, caller(request))
        return json_response(view(secret), 201)

    return create


create_scim_token = minting(token.SCIM, "SCIM", lambda s: ScimTokenView(token=s))
create_metrics_token = minting(endpoint.TOKEN, "metrics", lambda s: MetricsTokenView(token=s))
