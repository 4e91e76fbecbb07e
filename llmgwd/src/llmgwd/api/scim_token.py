"""/api/v1's SCIM token: a new bearer token for the identity provider's /scim/v2, shown once."""

from __future__ import annotations

import logging

from aiohttp import web

from llmgw.api_types import ScimTokenView
from llmgwd.api.base import _ctx, _who, json_response
from llmgwd.scim import token

log = logging.getLogger(__name__)


async def create_scim_token(request: web.Request) -> web.Response:
    """POST /scim/token: a new SCIM token, replacing the old one."""
    secret = await token.mint(_ctx(request).catalog.store)
    log.info("a new SCIM token made by %s (the old one stops)", _who(request))
    return json_response(ScimTokenView(token=secret), 201)
