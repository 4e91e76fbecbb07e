"""What every console handler shares: its context, the signed-in person, rendering a page and the
error page every refusal is shown in."""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jinja2
from aiohttp import web
from aiohttp.typedefs import Handler

from llmgwd import auth
from llmgwd.catalog import ApiKey, Catalog
from llmgwd.console import csrf, ended
from llmgwd.console.forms import Routes
from llmgwd.console.session import COOKIE, FLASH, Session, Sessions
from llmgwd.people.oidc import Provider
from llmgwd.people.signin import SignIn
from llmgwd.store import Store

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
PREFIX = "/console"
NAV = web.RequestKey("llmgw.console.nav", list)  # a person's pages' links (console.nav)
LIVE = web.RequestKey("llmgw.console.live", Session)  # the request's session, not signed out
# A page a form may send the person back to (a model's card: /console/models/q2.5), never `..`.
BACK = re.compile(r"/console/(?!.*\.\.)[a-z0-9/._-]*")


class Keys(auth.KeyLookup, Protocol):
    """The catalog's key checks: by the key itself (sign-in) and by id (each request)."""

    def live_key(self, key_id: str) -> ApiKey | None:
        """The key with this id, if live now."""
        ...

    async def revoke_key(self, key_id: str) -> ApiKey:
        """Revoke the key with this id (an OIDC session's, at its sign-out)."""
        ...

    @property
    def store(self) -> Store:
        """The store (the people directory's, for the rules' membership roles)."""
        ...


@dataclass(frozen=True, slots=True)
class OidcSignIn:
    """The OIDC sign-in /api/v1/login serves (its very provider, keys cached once, and
    sign-in), for the console's: console.oidc_signin."""

    provider: Provider
    signin: SignIn
    keys: Catalog  # where the session key is made
    public_url: str  # the client port's (client.public_url); "": each request's own


@dataclass(frozen=True, slots=True)
class Console:
    """What the console's handlers reach: the API it sends every request to, the keys, the
    session cookie, the route table (by route key) and the templates."""

    api: web.Application  # /api/v1's sub-application, mounted at API_PREFIX
    keys: Keys
    sessions: Sessions
    csrf_key: bytes
    routes: Routes
    templates: jinja2.Environment
    oidc: OidcSignIn | None = None  # sign-in through the site's provider; None: not set up


CONSOLE = web.AppKey("llmgw.console", Console)


class ConsoleError(Exception):
    """A refusal, shown in the console's error page with its status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Person:
    """Who is signed in: the principal /api/v1 would give their key, and their session."""

    who: auth.Principal
    session: str  # the cookie's value
    csrf: str  # the form token of that session
    opened: Session  # what the cookie holds: its key's id, kind, session id and end


def console(request: web.Request) -> Console:
    """The console's context for a request's handler."""
    return request.config_dict[CONSOLE]


def signed_in(request: web.Request) -> Person | None:
    """The session's person: its cookie checked by live_sessions (signed, unexpired, not signed
    out), its key re-resolved now (a revoked or expired key, or a deactivated user's, is no
    one), its principal made as /api/v1 makes a key's."""
    c = console(request)
    session = request.get(LIVE)
    key = c.keys.live_key(session.key_id) if session else None
    if session is None or key is None:
        return None
    value = request.cookies.get(COOKIE, "")
    return Person(auth.of_key(key), value, csrf.token(c.csrf_key, value), session)


@web.middleware
async def live_sessions(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The session cookie opened once a request and looked up among the signed-out ones (one
    store read); signed_in trusts only a session this let through (LIVE)."""
    value = request.cookies.get(COOKIE, "")
    c = console(request)
    session = c.sessions.opened(value) if value else None
    static = request.path.startswith(PREFIX + "/static/")
    if session is not None and not static and not await ended.ended(c.keys.store, session):
        request[LIVE] = session
    return await handler(request)


def see_other(location: str) -> web.Response:
    """A 303 to location (after a form, or to the sign-in page)."""
    return web.Response(status=303, headers={"Location": location})


def render(
    request: web.Request, template: str, person: Person | None, http: int = 200, **data: Any
) -> web.Response:
    """A page of the console, with the person's form token and any flash message."""
    c = console(request)
    flash = c.sessions.flashed(request.cookies.get(FLASH, ""))
    data.setdefault("page", "")
    data.setdefault("csrf", person.csrf if person else "")
    data.setdefault("nav", request.get(NAV, []))
    page = c.templates.get_template(template).render(person=person, flash=flash, **data)
    response = web.Response(text=page, status=http, content_type="text/html")
    if FLASH in request.cookies:
        c.sessions.unflash(response)
    return response


@web.middleware
async def error_pages(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal in the console's error page: a ConsoleError, an HTTP error (404, 405), or
    a failure (500, logged by its route, never with a form's fields)."""
    try:
        return await handler(request)
    except ConsoleError as e:
        status, message = e.status, e.message
    except web.HTTPException as e:
        if e.status < 400:
            raise
        status, message = e.status, e.reason
    except Exception:
        log.exception("console: %s %s failed", request.method, request.path)
        status, message = 500, "internal error"
    try:
        person = signed_in(request)
        return render(request, "error.html", person, status, code=status, message=message)
    except Exception:  # the error page itself failed: say so plainly, still a console answer
        log.exception("console: the error page for %s %s failed", request.method, request.path)
        return web.Response(status=500, text="500: internal error", content_type="text/plain")


def once() -> str:
    """A one-time nonce for a form whose answer shows a secret (console.made spends it)."""
    return secrets.token_urlsafe(16)


def templates() -> jinja2.Environment:
    """The console's templates, autoescaped; once() is theirs to call."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["once"] = once
    return env
