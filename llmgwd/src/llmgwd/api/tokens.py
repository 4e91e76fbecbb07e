"""/api/v1's join tokens: a new one and the command a node joins with."""

from __future__ import annotations

import logging
import shlex

from aiohttp import web

from llmgw.api_types import TokenView
from llmgwd.api.base import api_context, caller, json_response

log = logging.getLogger(__name__)


async def create_token(request: web.Request) -> web.Response:
    """POST /tokens: a new join token and the command a node joins with."""
    ctx = api_context(request)
    token = ctx.mint_token()
    await ctx.catalog.add_token(token, ctx.token_ttl_s)
    log.info("join token made by %s", caller(request))
    command = f"llmgw node join {shlex.quote(ctx.join_url)} --token {shlex.quote(token)}"
    view = TokenView(
        token=token, expires_in=int(ctx.token_ttl_s), url=ctx.join_url, command=command
    )
    return json_response(view, 201)
