"""The console's usage page: tokens, requests and spend by organization, team, project, user, key,
model or day since a chosen day, read from GET /api/v1/usage (or /orgs/{org}/usage) as the
signed-in person, so the page shows /api/v1's own figures and only what it lets them see."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from urllib.parse import urlencode

from aiohttp import web

from llmgw.api_types import OrgView, UsageReport, UsageRow
from llmgwd import auth
from llmgwd.console import inproc, pages
from llmgwd.console.base import PREFIX, ConsoleError, Person, console, render
from llmgwd.console.signin import required
from llmgwd.people.directory import Directory

EVERY = ""  # the scope of every organization: GET /usage
WHOLE = "/usage"
ONE_ORG = "/orgs/{org}/usage"
QUERY = ("by", "since")  # what the page's form passes on to /api/v1, as it is
LABELS = {
    "org": "Organization",
    "team": "Team",
    "project": "Project",
    "user": "User",
    "key": "Key",
    "model": "Model",
    "day": "Day",
}
PAGE = PREFIX + "/usage"


@dataclass(frozen=True, slots=True)
class Line:
    """One row of the report as the page shows it: its group's value, and the key's name."""

    group: str  # the grouping field's value ("" for keys of no such level)
    name: str  # a key's name (grouped by key), else ""
    row: UsageRow


@dataclass(frozen=True, slots=True)
class Period:
    """A link to a period the page offers: its words and its first day."""

    words: str
    since: str
    href: str


async def scopes(request: web.Request, person: Person) -> list[str]:
    """Whose usage the person may read, as /api/v1's rules say: every organization's (EVERY,
    first) where GET /usage lets them, and each organization GET /orgs/{org}/usage does."""
    c = console(request)
    roles = Directory(c.keys.store)
    whole, one = c.routes.get("GET", WHOLE), c.routes.get("GET", ONE_ORG)
    out = [EVERY] if whole and await auth.allowed(person.who, whole.rule, {}, roles) else []
    if one is None:
        return out
    orgs: list[OrgView] = await pages.read(request, person, "/orgs")
    for org in orgs:
        if await auth.allowed(person.who, one.rule, {"org": org.name}, roles):
            out.append(org.name)
    return out


async def report(
    request: web.Request, person: Person, org: str, query: Mapping[str, str]
) -> UsageReport:
    """What GET /usage (org EVERY) or /orgs/{org}/usage answers this person with query; its
    refusal (a bad period: 400) is the page's."""
    c = console(request)
    plain, params = (ONE_ORG, {"org": org}) if org else (WHOLE, {})
    route = c.routes.get("GET", plain)
    if route is None:
        raise ConsoleError(500, f"/api/v1 has no GET {plain}")
    answer = await inproc.call(request, c.api, person.who, route, params, query=query)
    if not answer.ok:
        raise ConsoleError(answer.status, answer.message())
    report: UsageReport = inproc.decoded(answer, route)
    return report


def lines(usage: UsageReport) -> list[Line]:
    """The report's rows as the page's table and charts show them."""
    return [Line(str(getattr(r, usage.by, None) or ""), r.name or "", r) for r in usage.rows]


def periods(today: date, query: Mapping[str, str]) -> list[Period]:
    """Links to the periods most asked for, each keeping the page's other choices."""
    starts = (
        ("This month", today.replace(day=1)),
        ("Last 7 days", today - timedelta(days=6)),
        ("Last 30 days", today - timedelta(days=29)),
        ("This year", today.replace(month=1, day=1)),
    )
    out = []
    for words, start in starts:
        q = {**{k: v for k, v in query.items() if v}, "since": start.isoformat()}
        out.append(Period(words, start.isoformat(), PAGE + "?" + urlencode(q)))
    return out


def _chosen_org(request: web.Request, person: Person, choices: list[str]) -> str:
    """The organization the query names, else every one where allowed, else the first the
    person may read; an organization not theirs is /api/v1's to refuse."""
    org = request.query.get("org", "")
    if org or EVERY in choices:
        return org
    if not choices:
        raise ConsoleError(403, f"{person.who.label} may read no organization's usage")
    return choices[0]


async def usage_page(request: web.Request) -> web.Response:
    """GET /console/usage?org=&by=&since=: the usage report of the chosen organization (or
    every one), grouping and period, in a table and in charts drawn by static/usage.js."""
    person = required(request)
    choices = await scopes(request, person)
    org = _chosen_org(request, person, choices)
    query = {k: request.query[k] for k in QUERY if request.query.get(k)}
    usage = await report(request, person, org, query)
    today = datetime.now(UTC).date()  # the meter's days are UTC's
    kept = {"org": org, "by": usage.by}
    return render(
        request,
        "usage.html",
        person,
        page="usage",
        usage=usage,
        lines=lines(usage),
        org=org,
        scopes=choices,
        groups=LABELS,
        group=LABELS.get(usage.by, usage.by),
        periods=periods(today, kept),
    )
