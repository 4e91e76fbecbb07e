"""The console's page of one organization (/console/org/ORG): its teams, projects, members, keys
and limits at each level, read through /api/v1's GET routes as the signed-in person (so another
organization's admin gets /api/v1's 403), with the forms that person's rules allow."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from llmgw.api_types import (
    LevelView,
    MembershipView,
    OrgView,
    PersonKeyView,
    ProjectView,
    TeamView,
)
from llmgw.api_types.limits import KeyLimits
from llmgwd import auth
from llmgwd.accounting.level_keys import org_level, project_level, team_level
from llmgwd.console import forms
from llmgwd.console.base import BACK, PREFIX, ConsoleError, Person, console, render, see_other
from llmgwd.console.forms import Drawn, Field, Form
from llmgwd.console.pages import read
from llmgwd.console.signin import required
from llmgwd.people.directory import Directory

PAGE = PREFIX + "/org"
MADE = PREFIX + "/made"  # where a form that makes a key goes: its answer shows the secret once


def select(*options: str) -> str:
    """A Field's kind for a <select> of these options (the console's templates draw it)."""
    return "select:" + "|".join(options)


ROLE = Field("body.role", "Role", select("member", "manager", "admin"), "member")
USER = Field("path.user", "User (name or id)", "text")
_TEXT = "text"
NAME, TITLE = Field("body.name", "Name", _TEXT), Field("body.title", "Title", _TEXT)
KEY_NAME, TEAM = Field("body.name", "Key name", _TEXT), Field("body.team", "Team", _TEXT)
LIMITS = (
    Field("body.rpm", "Requests a minute"),
    Field("body.tpm", "Tokens a minute"),
    Field("body.budget_tokens", "Token budget"),
    Field("body.budget_tokens_per", "Token budget per", select("day", "month"), "day"),
    Field("body.budget_spend", "Spend budget", step="any"),
    Field("body.budget_spend_per", "Spend budget per", select("day", "month"), "day"),
)
_ORG, _TEAM, _PROJECT = "/orgs/{org}", "/orgs/{org}/teams/{team}", "/orgs/{org}/projects/{project}"

# The organization's own forms, then each team's, each project's, each key's, each member's.
ORG_FORMS: tuple[Form, ...] = (
    Form("POST", _ORG + "/teams", "Add team", (NAME, TITLE)),
    Form(
        "POST", _ORG + "/projects", "Add project", (NAME, Field("body.team", "Team", _TEXT), TITLE)
    ),
    Form("PUT", _ORG + "/members/{user}", "Give a role", (USER, ROLE)),
    Form("PATCH", _ORG + "/limits", "Set limits", LIMITS),
    Form("DELETE", _ORG, "Delete the organization", danger=True),
)
TEAM_FORMS: tuple[Form, ...] = (
    Form("PUT", _TEAM + "/members/{user}", "Give a role", (USER, ROLE)),
    Form("PATCH", _ORG + "/limits/teams/{name}", "Set limits", LIMITS),
    Form("DELETE", _TEAM, "Delete the team", danger=True),
)
PROJECT_FORMS: tuple[Form, ...] = (
    Form("PUT", _PROJECT + "/members/{user}", "Give a role", (USER, ROLE)),
    Form("PATCH", _ORG + "/limits/projects/{name}", "Set limits", LIMITS),
    Form("DELETE", _PROJECT, "Delete the project", danger=True),
)
# Sent to MADE, not /console/act: their answer holds a key's secret, shown on that page once.
KEY_MAKING: tuple[Form, ...] = (
    Form("POST", _PROJECT + "/keys", "Make my key", (KEY_NAME,)),
    Form("POST", _PROJECT + "/service-keys", "Make a service key", (KEY_NAME,)),
)
KEY_FORMS: tuple[Form, ...] = (Form("DELETE", _PROJECT + "/keys/{key}", "Revoke", danger=True),)
_SCOPED = {"org": _ORG, "team": _TEAM, "project": _PROJECT}
MEMBER_FORMS: dict[str, tuple[Form, ...]] = {
    kind: (
        Form("PUT", path + "/members/{user}", "Change role", (ROLE,)),
        Form("DELETE", path + "/members/{user}", "Remove", danger=True),
    )
    for kind, path in _SCOPED.items()
}
FORMS: tuple[Form, ...] = (
    *ORG_FORMS, *TEAM_FORMS, *PROJECT_FORMS, *KEY_MAKING, *KEY_FORMS,
    *(f for group in MEMBER_FORMS.values() for f in group),
)  # fmt: skip


def limit_values(limits: KeyLimits | None) -> dict[str, str]:
    """A limits form's inputs as the level has them now (0: no limit)."""
    got = limits or KeyLimits()
    return {
        "body.rpm": str(got.rpm),
        "body.tpm": str(got.tpm),
        "body.budget_tokens": str(got.budget_tokens),
        "body.budget_tokens_per": got.budget_tokens_per,
        "body.budget_spend": f"{got.budget_spend:g}",
        "body.budget_spend_per": got.budget_spend_per,
    }


async def drawn(
    request: web.Request,
    person: Person,
    group: Sequence[Form],
    params: Mapping[str, str],
    values: Mapping[str, str] | None = None,
) -> list[Drawn]:
    """The forms of group this person may send, each given those of params its path names
    (as its route's guard sees them)."""
    c = console(request)
    roles = Directory(c.keys.store)
    out: list[Drawn] = []
    for form in group:
        plain = c.routes.of(form).plain
        mine = {k: v for k, v in params.items() if f"{{{k}}}" in plain}
        out += await forms.drawn(person.who, c.routes, (form,), mine, roles, values)
    return out


async def readable(
    request: web.Request, person: Person, plain: str, params: Mapping[str, str] | None = None
) -> Any:
    """What GET plain answers, or None where its guard refuses this person (403)."""
    try:
        return await read(request, person, plain, params)
    except ConsoleError as e:
        if e.status == 403:
            return None
        raise


@dataclass(slots=True)
class Unit:
    """A team or a project as the page shows it: its limits, members, keys and forms."""

    kind: str  # "team", "project"
    view: TeamView | ProjectView
    limits: LevelView | None
    forms: list[Drawn]
    keys: list[PersonKeyView] | None = None  # a project's, where the person may list them
    key_forms: dict[str, list[Drawn]] = field(default_factory=dict)  # by key id
    making: list[Drawn] = field(default_factory=list)  # a project's key forms


@dataclass(slots=True)
class Member:
    """A membership, the user's name where the person may read users, and its forms."""

    view: MembershipView
    name: str
    forms: list[Drawn]


@dataclass(slots=True)
class OrgPage:
    """All the organization page shows."""

    org: OrgView
    limits: LevelView | None
    forms: list[Drawn]
    teams: list[Unit]
    projects: list[Unit]
    members: list[Member]


async def _team(
    request: web.Request, person: Person, org: str, t: TeamView, limits: Mapping[str, LevelView]
) -> Unit:
    level = limits.get(team_level(org, t.name))
    params = {"org": org, "team": t.name, "name": t.name}
    values = limit_values(level.limits if level else None)
    return Unit("team", t, level, await drawn(request, person, TEAM_FORMS, params, values))


async def _project(
    request: web.Request, person: Person, org: str, p: ProjectView, limits: Mapping[str, LevelView]
) -> Unit:
    level = limits.get(project_level(org, p.name))
    params = {"org": org, "project": p.name, "name": p.name}
    values = limit_values(level.limits if level else None)
    unit = Unit("project", p, level, await drawn(request, person, PROJECT_FORMS, params, values))
    keys = await readable(request, person, _PROJECT + "/keys", {"org": org, "project": p.name})
    unit.keys = keys if isinstance(keys, list) else None
    for k in unit.keys or []:
        if not k.revoked:
            unit.key_forms[k.id] = await drawn(request, person, KEY_FORMS, {**params, "key": k.id})
    unit.making = await drawn(request, person, KEY_MAKING, params)
    return unit


async def _names(request: web.Request, person: Person) -> dict[str, str]:
    """Users' names by id, where GET /users lets this person read them; else none."""
    users = await readable(request, person, "/users")
    return {u.id: u.name for u in users} if isinstance(users, list) else {}


async def _members(request: web.Request, person: Person, org: str) -> list[Member]:
    views: list[MembershipView] = await read(request, person, _ORG + "/members", {"org": org})
    names = await _names(request, person) if views else {}
    out = []
    for m in views:
        params = {"org": org, "user": m.user}
        if m.scope.kind != "org":
            params[m.scope.kind] = m.scope.name
        group = MEMBER_FORMS[m.scope.kind]
        got = await drawn(request, person, group, params, {"body.role": m.role})
        out.append(Member(m, names.get(m.user, ""), got))
    return out


async def org_of(request: web.Request, person: Person, name: str) -> OrgPage:
    """The organization as this person may read it; /api/v1's refusal (403, 404) is theirs."""
    org: OrgView = await read(request, person, _ORG, {"org": name})
    params = {"org": name}
    teams: list[TeamView] = await read(request, person, _ORG + "/teams", params)
    projects: list[ProjectView] = await read(request, person, _ORG + "/projects", params)
    levels: list[LevelView] = await read(request, person, _ORG + "/limits", params)
    by_level = {v.level: v for v in levels}
    mine = by_level.get(org_level(name))
    values = limit_values(mine.limits if mine else None)
    return OrgPage(
        org=org,
        limits=mine,
        forms=await drawn(request, person, ORG_FORMS, params, values),
        teams=[await _team(request, person, name, t, by_level) for t in teams],
        projects=[await _project(request, person, name, p, by_level) for p in projects],
        members=await _members(request, person, name),
    )


def back_to(name: str) -> str:
    """Where a form of the page returns to: the page, or /console/org where act would not
    send the person back to the organization's own address."""
    here = f"{PAGE}/{name}"
    return here if BACK.fullmatch(here) else PAGE


async def org_page(request: web.Request) -> web.Response:
    """GET /console/org/{org}: one organization, as GET /api/v1/orgs/{org} and the routes
    under it answer the signed-in person."""
    person = required(request)
    name = request.match_info["org"]
    page = await org_of(request, person, name)
    usage = await _usage_link(request, person, name)
    return render(
        request, "org.html", person, page="org", o=page, back=back_to(name), made=MADE, usage=usage
    )


async def _usage_link(request: web.Request, person: Person, org: str) -> str:
    """The usage page of the organization, where GET /orgs/{org}/usage lets the person read."""
    c = console(request)
    route = c.routes.get("GET", _ORG + "/usage")
    roles = Directory(c.keys.store)
    if route is None or not await auth.allowed(person.who, route.rule, {"org": org}, roles):
        return ""
    return f"{PREFIX}/usage?" + urlencode({"org": org})


async def my_org(request: web.Request) -> web.Response:
    """GET /console/org: the person's organization (GET /orgs as they read it); with several,
    a list to choose from; with none, a 404 as /api/v1's would be."""
    person = required(request)
    orgs: list[OrgView] = await read(request, person, "/orgs")
    if len(orgs) == 1:
        return see_other(f"{PAGE}/{orgs[0].name}")
    if not orgs:
        raise ConsoleError(404, f"{person.who.label} is a member of no organization")
    return render(
        request, "org.html", person, page="org", o=None, orgs=orgs, back=PAGE, made=MADE, usage=""
    )
