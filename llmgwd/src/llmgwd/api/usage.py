"""/api/v1's usage: tokens, requests and spend summed by key, model, day, organization, team,
project or user."""

from __future__ import annotations

from aiohttp import web

from llmgwd.accounting import views
from llmgwd.accounting.views import Owner
from llmgwd.api.base import api_context, checked, json_response, not_found
from llmgwd.catalog import ApiKey
from llmgwd.people.directory import Directory


async def get_usage(request: web.Request) -> web.Response:
    """GET /usage?by=key|model|day|org|team|project|user&since=YYYY-MM-DD: usage summed,
    counts not flushed too."""
    return await _report(request, "")


async def get_org_usage(request: web.Request) -> web.Response:
    """GET /orgs/{org}/usage?by=...&since=...: the usage of the organization's keys only."""
    org = request.match_info["org"]
    if await Directory(api_context(request).catalog.store).org(org) is None:
        raise not_found("organization", org)
    return await _report(request, org)


async def _report(request: web.Request, org: str) -> web.Response:
    """The usage report the query asks for, of every key or of one organization's keys."""
    ctx = api_context(request)
    by = checked(views.parse_group, "by", request.query.get("by"))
    since = checked(views.parse_day, "since", request.query.get("since"))
    every = ctx.catalog.keys()
    keys = [k for k in every if not org or k.org == org]
    names = {k.id: k.name for k in keys}
    owners = await _owners(Directory(ctx.catalog.store), keys) if by == "team" else None
    if owners is None and by in views.LEVEL_GROUPS:
        owners = {k.id: _owner(k, "") for k in keys}
    records = await ctx.usage.records(since)
    if org:
        records = [r for r in records if r.key_id in names]
    return json_response(views.report(records, by, since, names, owners))


async def _owners(people: Directory, keys: list[ApiKey]) -> dict[str, Owner]:
    """Each key's owner, with its project's team (read from the directory)."""
    teams: dict[tuple[str, str], str] = {}
    for org in {k.org for k in keys if k.project}:
        teams.update({(org, p.name): p.team for p in await people.projects(org)})
    return {k.id: _owner(k, teams.get((k.org, k.project), "")) for k in keys}


def _owner(key: ApiKey, team: str) -> Owner:
    return Owner(
        org=key.org,
        team=f"{key.org}/{team}" if team else "",
        project=f"{key.org}/{key.project}" if key.project else "",
        user=key.user,
    )
