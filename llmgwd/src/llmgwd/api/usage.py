"""/api/v1's usage: tokens, requests and spend summed by key, model or day."""

from __future__ import annotations

from aiohttp import web

from llmgwd import meter_views
from llmgwd.api.base import _checked, _ctx, json_response


async def get_usage(request: web.Request) -> web.Response:
    """GET /usage?by=key|model|day&since=YYYY-MM-DD: usage summed, counts not flushed too."""
    ctx = _ctx(request)
    by = _checked(meter_views.parse_group, "by", request.query.get("by"))
    since = _checked(meter_views.parse_day, "since", request.query.get("since"))
    keys = ctx.catalog.keys()
    names = {k.id: k.name for k in keys}
    records = await ctx.usage.records(since)
    return json_response(meter_views.report(records, by, since, names))
