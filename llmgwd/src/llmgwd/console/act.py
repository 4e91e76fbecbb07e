"""POST /console/act: a console form sent to the /api/v1 route it names (a Route record's method
and path, exactly), run through that route's guard, request type and handler as the signed-in
person; then back to the page with what came of it."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

import msgspec
from aiohttp import web

from llmgwd.api.route import Route
from llmgwd.console import inproc
from llmgwd.console.base import PREFIX, ConsoleError, console, see_other
from llmgwd.console.signin import checked_form, required

log = logging.getLogger(__name__)

_BACK = re.compile(r"/console/(?!.*\.\.)[a-z0-9/._-]*")  # a model's card: /console/models/q2.5


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


def _route(form: Mapping[str, str], request: web.Request) -> Route:
    route = console(request).routes.by_key.get(form.get("route", ""))
    if route is None or route.method == "GET":
        raise ConsoleError(400, "the form names no route of /api/v1 that changes anything")
    return route


async def act(request: web.Request) -> web.Response:
    """POST /console/act {csrf, route, back, path.*, query.*, body.*}"""
    person = required(request)
    form = await checked_form(request, person)
    route = _route(form, request)
    body = _body(route, _fields(form, "body."))
    params, query = _fields(form, "path."), _fields(form, "query.")
    c = console(request)
    try:
        path = inproc.route_path(route, params)
        answer = await inproc.call(
            request, c.api, person.who, route, params, query=query, body=body
        )
    except ValueError as e:
        raise ConsoleError(400, str(e)) from None
    if not answer.ok:
        raise ConsoleError(answer.status, answer.message())
    back = form.get("back", "")
    response = see_other(back if _BACK.fullmatch(back) else PREFIX + "/")
    c.sessions.flash(response, f"Done: {route.method} {path}")
    return response
