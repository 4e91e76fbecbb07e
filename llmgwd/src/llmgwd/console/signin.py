"""Signing in to the console with an API key (a form, never a URL), and signing out; the sign-in
page offers the site's OIDC provider too where one is set up (console.oidc_signin)."""

from __future__ import annotations

import logging
import secrets

from aiohttp import web

from llmgwd import auth
from llmgwd.console import csrf, ended, oidc_signin
from llmgwd.console.base import (
    PREFIX,
    ConsoleError,
    Person,
    console,
    render,
    see_other,
    signed_in,
)
from llmgwd.console.session import BY_OIDC

log = logging.getLogger(__name__)

MAX_FORM_BYTES = 64 * 1024  # a form of the console; /api/v1's own body limit
PRE = "llmgw_console_pre"  # the sign-in form's nonce
PRE_AGE_S = 900


async def form_of(request: web.Request) -> dict[str, str]:
    """A form's fields (the first of each name; files are no field), bounded in size."""
    if request.content_length is None or request.content_length > MAX_FORM_BYTES:
        raise ConsoleError(413, f"a form of at most {MAX_FORM_BYTES} bytes, with its length")
    data = await request.post()
    out: dict[str, str] = {}
    for name, value in data.items():
        if isinstance(value, str):
            out.setdefault(name, value)
    return out


def _login_form(request: web.Request, http: int = 200, why: str = "") -> web.Response:
    """The sign-in page, its form's token bound to a fresh nonce in a cookie of its own (so a
    sign-in cannot be posted from another site: SameSite=Strict keeps the nonce home)."""
    c = console(request)
    nonce = secrets.token_urlsafe(16)
    token = csrf.token(c.csrf_key, "pre:" + nonce)
    extra = {"why": why} if why else {}
    provider = oidc_signin.provider_name(c)
    response = render(request, "login.html", None, http, csrf=token, provider=provider, **extra)
    response.set_cookie(
        PRE, nonce, max_age=PRE_AGE_S, path=PREFIX, secure=c.sessions.secure, httponly=True,
        samesite="Strict",
    )  # fmt: skip
    return response


async def login_page(request: web.Request) -> web.Response:
    """GET /console/login"""
    if signed_in(request) is not None:
        return see_other(PREFIX + "/")
    return _login_form(request)


async def login(request: web.Request) -> web.Response:
    """POST /console/login {key, csrf}: a session for a live key whose principal /api/v1
    knows; the form's token must be the one its page was given."""
    c = console(request)
    form = await form_of(request)
    nonce = request.cookies.get(PRE, "")
    if not nonce or not csrf.valid(c.csrf_key, "pre:" + nonce, form.get(csrf.FIELD, "")):
        log.warning("console: a sign-in without its form token")
        raise ConsoleError(403, "this form's token is missing or stale: load the page again")
    key = c.keys.authenticate(form.get("key", "").strip())
    if key is None:
        log.info("console: a sign-in with a key that is not valid")
        return _login_form(request, 401, "That key is not valid (or revoked).")
    who = auth.of_key(key)
    if who.staff is None and not who.user:
        log.info("console: %s refused, a key for /v1 only", who.label)
        return _login_form(request, 403, "That key reaches /v1 only.")
    log.info("console: %s signed in", who.label)
    response = see_other(PREFIX + "/")
    c.sessions.set(response, key.id)
    response.del_cookie(PRE, path=PREFIX, secure=c.sessions.secure, httponly=True)
    return response


def required(request: web.Request) -> Person:
    """The signed-in person, or a 303 to the sign-in page (for htmx's poll, HX-Redirect)."""
    person = signed_in(request)
    if person is None and request.headers.get("HX-Request") == "true":
        raise web.HTTPOk(headers={"HX-Redirect": PREFIX + "/login"})  # htmx: the whole page
    if person is None:
        raise web.HTTPSeeOther(PREFIX + "/login")
    return person


async def checked_form(request: web.Request, person: Person) -> dict[str, str]:
    """A signed-in person's form, refused (403) without the session's form token."""
    form = await form_of(request)
    if not csrf.valid(console(request).csrf_key, person.session, form.get(csrf.FIELD, "")):
        log.warning("console: %s sent a form without its form token", person.who.label)
        raise ConsoleError(403, "this form's token is missing or not this session's")
    return form


async def logout(request: web.Request) -> web.Response:
    """POST /console/logout: the session recorded as ended (every control plane refuses its
    cookie from now on), an OIDC sign-in's session key revoked, and the cookie cleared."""
    person = required(request)
    await checked_form(request, person)
    c = console(request)
    await ended.end(c.keys.store, person.opened)
    if person.opened.kind == BY_OIDC:  # the key was made for this session alone
        await c.keys.revoke_key(person.opened.key_id)
    log.info("console: %s signed out", person.who.label)
    response = see_other(PREFIX + "/login")
    c.sessions.clear(response)
    return response
