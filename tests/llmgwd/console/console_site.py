"""A client port with /api/v1 and the console over an in-memory store, its people and keys, and a
browser-like client (its own cookie jar) that signs in and sends the console's forms."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from html.parser import HTMLParser
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.config import Oidc
from llmgwd.api import login
from llmgwd.api.access import key_auth
from llmgwd.api.base import API_PREFIX, ApiContext, NodeInfo
from llmgwd.api.routes import api_subapp
from llmgwd.catalog import Catalog, KeyOwner, Model
from llmgwd.console import app as console
from llmgwd.people.directory import Directory
from llmgwd.people.records import Scope
from llmgwd.store.sqlite import SqliteStore

SECRET = b"s" * 32


class Nodes:
    """The cluster state's nodes, set by the test."""

    def __init__(self) -> None:
        self.items: list[NodeInfo] = []

    def nodes(self) -> list[NodeInfo]:
        return list(self.items)


class Site:
    """The client port's URL, its catalog and directory, and a key for each role."""

    def __init__(self, url: str, catalog: Catalog, nodes: Nodes) -> None:
        self.url, self.catalog, self.nodes = url, catalog, nodes
        self.people = Directory(catalog.store)
        self.keys: dict[str, str] = {}  # role -> key
        self.key_ids: dict[str, str] = {}


async def _fill(site: Site) -> None:
    """Keys: an admin key (no maker), staff users' own keys (operator, viewer), an org admin's
    own key (acme), and a user key of no maker (/v1 only); two models in the catalog."""
    d = site.people
    await d.create_org("acme")
    for name, staff in (("olga", "operator"), ("vic", "viewer"), ("ada", None)):
        user = await d.create_user(name)
        site.catalog.note_user(user)
        if staff is not None:
            await d.set_staff(user.id, staff)  # type: ignore[arg-type]
        role = staff or "org-admin"
        if staff is None:
            await d.set_member("", user.id, Scope(org="acme"), "admin")
        key, secret = await site.catalog.create_key(name, owner=KeyOwner(user=user.id))
        site.keys[role], site.key_ids[role] = secret, key.id
    for role, name in (("admin", "ops"), ("v1", "app")):
        key, secret = await site.catalog.create_key(name, "admin" if role == "admin" else "user")
        site.keys[role], site.key_ids[role] = secret, key.id
    for name in ("smol", "tiny"):
        await site.catalog.add_model(Model(name=name, source=f"file:/m/{name}.gguf", replicas=1))


@asynccontextmanager
async def serving(
    *, tls: bool = False, oidc: Oidc | None = None, middlewares: Sequence[Any] = (), **context: Any
) -> AsyncIterator[Site]:
    """The client port's /api/v1 and /console, filled as _fill says; oidc: the sign-in
    settings of /api/v1/login (mounted as the daemon mounts it, the console's OIDC sign-in
    its); middlewares: the client port's own (a trusted proxy's reading); context: more of
    the API's context (ApiContext's fields: slurm, slurm_status, ...)."""
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    nodes = Nodes()
    ctx = ApiContext(catalog=catalog, nodes=nodes, mint_token=lambda: "t", join_url="", **context)
    app = web.Application(middlewares=middlewares)
    signin = login.login_app(catalog, oidc or Oidc())
    app.add_subapp(login.PREFIX, signin)
    api = api_subapp(ctx, key_auth(catalog))
    app.add_subapp(API_PREFIX, api)
    console.mount(app, console.make(api, catalog, SECRET, tls=tls, login=signin))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    site = Site(str(server.make_url("")).rstrip("/"), catalog, nodes)
    await _fill(site)
    try:
        yield site
    finally:
        await server.close()
        await store.close()


class Browser:
    """A client with a cookie jar, as a browser keeps the console's cookies."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))

    async def close(self) -> None:
        await self.session.close()

    async def get(self, path: str) -> tuple[aiohttp.ClientResponse, str]:
        async with self.session.get(self.site.url + path, allow_redirects=False) as r:
            return r, await r.text()

    async def post(self, path: str, form: dict[str, str]) -> tuple[aiohttp.ClientResponse, str]:
        async with self.session.post(self.site.url + path, data=form, allow_redirects=False) as r:
            return r, await r.text()

    async def log_in(self, key: str) -> tuple[aiohttp.ClientResponse, str]:
        """The sign-in page's form sent with key."""
        _, html = await self.get("/console/login")
        return await self.post("/console/login", {"key": key, "csrf": csrf_of(html)})

    async def sign_in(self, role: str) -> None:
        r, _ = await self.log_in(self.site.keys[role])
        assert r.status == 303, role


class Forms(HTMLParser):
    """The forms of a page: each one's hidden fields (route, csrf, path.*)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.forms: list[dict[str, str]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.forms.append({"action": a.get("action", "")})
        elif tag == "input" and self.forms and a.get("type") == "hidden":
            self.forms[-1][a.get("name", "")] = a.get("value", "")


def csrf_of(html: str) -> str:
    """The form token a page's forms carry."""
    m = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert m, "the page has no form token"
    return m.group(1)
