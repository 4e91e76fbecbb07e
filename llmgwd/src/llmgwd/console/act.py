"""POST /console/act: a console form sent to the /api/v1 route it names (a Route record's method
and path, exactly, and one a form of the console's sends), run through that route's guard,
request type and handler as the signed-in person; then back to the page with what came of it.
The form-to-route runner here is /console/made's too."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import msgspec
from aiohttp import web

from llmgwd.api.route import Route
from llmgwd.console import inproc
from llmgwd.console.base import BACK, PREFIX, ConsoleError, Person, console, see_other
from llmgwd.console.signin import checked_form, required

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Sent:
    """A form run: the route it named, the path it went to and what the route answered."""

    route: Route
    path: str
    answer: inproc.Answer


def _fields(form: Mapping[str, str], part: str) -> dict[str, str]:
    return {k.removeprefix(part): v for k, v in form.items() if k.startswith(part)}


def _body(route: Route, fields: Mapping[str, str]) -> bytes | None:
    """The JSON body of the route's request type from a form's body.* fields (strings read as
    the type's numbers and booleans); the handler decodes and checks it again as sent."""
    if route.request is None:
        if fields:
            raise ConsoleError(400, f"{route.method} {route.path} takes no body")
        return None
    try:
        value = msgspec.convert(dict(fields), type=route.request, strict=False)
    except msgspec.ValidationError as e:
        raise ConsoleError(400, str(e)) from None
    return msgspec.json.encode(value)


async def run(
    request: web.Request, person: Person, form: Mapping[str, str], allowed: Collection[str]
) -> Sent:
    """Send a checked form to the route it names, one of allowed (route keys; else a 400), as
    the person; a refusal (the guard's 403, a 400, 404, 409) is a ConsoleError of its status."""
    c = console(request)
    key = form.get("route", "")
    route = c.routes.by_key.get(key)
    if route is None or key not in allowed:
        raise ConsoleError(400, "the form names no route of /api/v1 that this form may send")
    body = _body(route, _fields(form, "body."))
    params, query = _fields(form, "path."), _fields(form, "query.")
    try:
        path = inproc.route_path(route, params)
        answer = await inproc.call(
            request, c.api, person.who, route, params, query=query, body=body
        )
    except ValueError as e:
        raise ConsoleError(400, str(e)) from None
    if not answer.ok:
        raise ConsoleError(answer.status, answer.message())
    return Sent(route, path, answer)


def back_of(form: Mapping[str, str], default: str) -> str:
    """The page a form names to return to (`back`), if it is a console page; else default."""
    back = form.get("back", "")
    return back if BACK.fullmatch(back) else default


async def act(request: web.Request) -> web.Response:
    """POST /console/act {csrf, route, back, path.*, query.*, body.*}"""
    person = required(request)
    form = await checked_form(request, person)
    sent = await run(request, person, form, console(request).routes.acts)
    response = see_other(back_of(form, PREFIX + "/"))
    console(request).sessions.flash(response, f"Done: {sent.route.method} {sent.path}")
    return response
