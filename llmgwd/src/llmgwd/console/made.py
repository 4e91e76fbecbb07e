"""POST /console/made: a form that makes a key (or the SCIM token) sent to its /api/v1 route as
the signed-in person (act's runner); its answer, never cached, is the only place the secret is
shown (no redirect, no flash, no log)."""

from __future__ import annotations

from aiohttp import web

from llmgwd.console import inproc
from llmgwd.console.act import back_of, run
from llmgwd.console.base import PREFIX, console, render
from llmgwd.console.signin import checked_form, required

PAGE = PREFIX + "/people"


async def made(request: web.Request) -> web.Response:
    """POST /console/made {csrf, route, back, path.*, body.*}"""
    person = required(request)
    form = await checked_form(request, person)
    sent = await run(request, person, form, console(request).routes.makes)
    got = inproc.decoded(sent.answer, sent.route)
    secret = str(getattr(got, "key", "") or getattr(got, "token", ""))
    return render(
        request,
        "made.html",
        person,
        sent.answer.status,
        page="people",
        got=got,
        secret=secret,
        back=back_of(form, PAGE),
    )
