"""POST /console/made: a form that makes a key (or the SCIM token) sent to its /api/v1 route as
the signed-in person (act's runner); its answer, never cached, is the only place the secret is
shown (no redirect, no flash, no log). Each such form carries a one-time nonce (`once`): sent
again (the answer page refreshed), it is a 409, not a second key."""

from __future__ import annotations

import re

from aiohttp import web

from llmgwd.console import inproc
from llmgwd.console.act import back_of, run
from llmgwd.console.base import PREFIX, ConsoleError, console, render
from llmgwd.console.signin import checked_form, required
from llmgwd.store import Compare, Put, Store

PAGE = PREFIX + "/people"
USED = "/console/made/"  # + a form's nonce: sent once already (kept as long as a session lasts)
_ONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")  # base.once()'s


async def first_use(store: Store, once: str, ttl_s: float) -> bool:
    """Whether this is the nonce's first use (then it is recorded used, for ttl_s)."""
    lease = await store.lease_grant(ttl_s)
    res = await store.txn(
        [Compare(USED + once, "version", "=", 0)], [Put(USED + once, b"1", lease)]
    )
    if not res.succeeded:
        await store.lease_revoke(lease)  # the first use's lease keeps it
    return res.succeeded


async def made(request: web.Request) -> web.Response:
    """POST /console/made {csrf, route, back, once, path.*, body.*}"""
    person = required(request)
    form = await checked_form(request, person)
    c = console(request)
    if form.get("route", "") not in c.routes.makes:  # before the nonce is spent: act.run's 400
        raise ConsoleError(400, "the form names no route of /api/v1 that this form may send")
    once = form.get("once", "")
    if not _ONCE.fullmatch(once):
        raise ConsoleError(400, "this form has no one-time token: load its page again")
    if not await first_use(c.keys.store, once, c.sessions.max_age_s):
        raise ConsoleError(409, "this form was sent already: its secret was shown then, once")
    sent = await run(request, person, form, c.routes.makes)
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
