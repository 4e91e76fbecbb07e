"""/api/v1's limits, budgets and model lists of organizations, teams, projects and users
(llmgwd.accounting.levels); each route with its rule in TABLE: an organization's admin sets
its own, its teams' and its projects', a staff admin every one, and a user's only a staff admin."""

from __future__ import annotations

import logging

from aiohttp import web

from llmgw.api_types import LevelIn, LevelView, LimitsIn
from llmgwd.accounting import levels, views
from llmgwd.api.base import (
    api_context,
    bad_field,
    caller,
    checked,
    json_response,
    not_found,
    read_body,
)
from llmgwd.api.people import _dir
from llmgwd.api.route import Route
from llmgwd.auth import STAFF_ADMIN, STAFF_READ, org_rule

log = logging.getLogger(__name__)
MAX_MODELS = 1000


def _view(level: str, record: levels.LevelLimits) -> LevelView:
    return LevelView(level=level, limits=record.limits, models=list(record.models))


async def get_org_limits(request: web.Request) -> web.Response:
    """GET /orgs/{org}/limits: the organization's, then each team's and project's."""
    org = request.match_info["org"]
    people = _dir(request)
    if await people.org(org) is None:
        raise not_found("organization", org)
    ids = [levels.org_level(org)]
    ids += [levels.team_level(org, t.name) for t in await people.teams(org)]
    ids += [levels.project_level(org, p.name) for p in await people.projects(org)]
    store = api_context(request).catalog.store
    return json_response([_view(i, await levels.read(store, i)) for i in ids])


async def set_org_limits(request: web.Request) -> web.Response:
    """PATCH /orgs/{org}/limits"""
    org = request.match_info["org"]
    if await _dir(request).org(org) is None:
        raise not_found("organization", org)
    return await _change(request, levels.org_level(org))


async def set_team_limits(request: web.Request) -> web.Response:
    """PATCH /orgs/{org}/limits/teams/{name}"""
    org, name = request.match_info["org"], request.match_info["name"]
    if name not in {t.name for t in await _dir(request).teams(org)}:
        raise not_found("team", f"{org}/{name}")
    return await _change(request, levels.team_level(org, name))


async def set_project_limits(request: web.Request) -> web.Response:
    """PATCH /orgs/{org}/limits/projects/{name}"""
    org, name = request.match_info["org"], request.match_info["name"]
    if name not in {p.name for p in await _dir(request).projects(org)}:
        raise not_found("project", f"{org}/{name}")
    return await _change(request, levels.project_level(org, name))


async def get_user_limits(request: web.Request) -> web.Response:
    """GET /users/{user}/limits"""
    level = levels.user_level(await _user_id(request))
    return json_response(_view(level, await levels.read(api_context(request).catalog.store, level)))


async def set_user_limits(request: web.Request) -> web.Response:
    """PATCH /users/{user}/limits"""
    return await _change(request, levels.user_level(await _user_id(request)))


async def _user_id(request: web.Request) -> str:
    ident = request.match_info["user"]
    user = await _dir(request).user(ident)
    if user is None:
        raise not_found("user", ident)
    return user.id


async def _change(request: web.Request, level: str) -> web.Response:
    """Apply a LevelIn to a level's stored record."""
    ctx = api_context(request)
    body = await read_body(request, LevelIn)
    store = ctx.catalog.store
    current = await levels.read(store, level)
    given = LimitsIn(**{f: getattr(body, f) for f in LimitsIn.__struct_fields__})
    limits = checked(views.apply_limits, current.limits, given)
    models = current.models if body.models is None else _models(request, body.models)
    record = await levels.change(store, level, levels.LevelLimits(limits=limits, models=models))
    log.info("%s limits set to %s, models %s, by %s", level, limits, models, caller(request))
    return json_response(_view(level, record))


def _models(request: web.Request, names: list[str]) -> list[str]:
    """The models of a list, each in the catalog, without repeats."""
    if len(names) > MAX_MODELS:
        raise bad_field("models", f"at most {MAX_MODELS} models")
    catalog = api_context(request).catalog
    for name in names:
        if catalog.get(name) is None:
            raise bad_field("models", f"no model {name!r} in the catalog")
    return sorted(set(names))


_ORG, _ADMIN = "/orgs/{org}/limits", org_rule("admin")
TABLE: list[Route] = [
    Route("GET", _ORG, get_org_limits, org_rule("member", read=True), answer=list[LevelView]),
    Route("PATCH", _ORG, set_org_limits, _ADMIN, LevelIn, LevelView),
    Route("PATCH", _ORG + "/teams/{name}", set_team_limits, _ADMIN, LevelIn, LevelView),
    Route("PATCH", _ORG + "/projects/{name}", set_project_limits, _ADMIN, LevelIn, LevelView),
    Route("GET", "/users/{user}/limits", get_user_limits, STAFF_READ, answer=LevelView),
    Route("PATCH", "/users/{user}/limits", set_user_limits, STAFF_ADMIN, LevelIn, LevelView),
]
