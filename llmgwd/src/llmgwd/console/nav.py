"""The console's navigation: a page's link drawn only for a person whose principal passes the
rule of the /api/v1 GET route that page cannot be without (the route table's, never a second
list): an organization's admin with no staff role is shown no staff page."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler

from llmgwd import auth
from llmgwd.console.base import NAV, PREFIX, Person, console, signed_in
from llmgwd.people.directory import Directory


@dataclass(frozen=True, slots=True)
class Link:
    """A link of the navigation: its page's name (for aria-current), address, words, and the
    GET route its page reads ("": a page every person has, such as their organization's)."""

    page: str
    href: str
    label: str
    reads: str = ""


LINKS: tuple[Link, ...] = (
    Link("overview", PREFIX + "/", "Overview", "/status"),
    Link("models", PREFIX + "/models", "Models", "/models"),
    Link("nodes", PREFIX + "/nodes", "Nodes", "/nodes"),
    Link("gpus", PREFIX + "/gpus", "GPU map", "/nodes"),
    Link("usage", PREFIX + "/usage", "Usage"),
    Link("people", PREFIX + "/people", "People"),
    Link("org", PREFIX + "/org", "Organization"),
    Link("mirror", PREFIX + "/mirror", "Mirror", "/mirror"),
    Link("slurm", PREFIX + "/slurm", "Slurm", "/slurm"),
)


def _rule(request: web.Request, plain: str) -> auth.Rule | None:
    route = console(request).routes.get("GET", plain)
    return route.rule if route is not None else None


async def _passes(request: web.Request, person: Person, rule: auth.Rule | None) -> bool:
    roles = Directory(console(request).keys.store)
    return rule is not None and await auth.allowed(person.who, rule, {}, roles)


async def may_read(request: web.Request, person: Person, plain: str) -> bool:
    """Whether the person passes the rule of GET plain (a route of no path parameter)."""
    return await _passes(request, person, _rule(request, plain))


async def links_for(request: web.Request, person: Person) -> list[Link]:
    """The links this person's pages show, each rule asked once (the staff pages' are one)."""
    passes: dict[auth.Rule | None, bool] = {}
    out = []
    for link in LINKS:
        if link.reads:
            rule = _rule(request, link.reads)
            if rule not in passes:
                passes[rule] = await _passes(request, person, rule)
            if not passes[rule]:
                continue
        out.append(link)
    return out


@web.middleware
async def navigation(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A signed-in person's links, worked out for a page (not for a static file, nor for
    htmx's poll of a page's live part, which draws no navigation)."""
    static = request.path.startswith(PREFIX + "/static/")
    if not static and request.headers.get("HX-Request") != "true":
        person = signed_in(request)
        if person is not None:
            request[NAV] = await links_for(request, person)
    return await handler(request)
