"""The console's usage page as a browser sees it: its figures are /api/v1/usage's for the same
person and period, an organization's admin sees only their organization's, the page keeps the
strict policy, and a bad period is the console's 400 page."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from html.parser import HTMLParser
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd.accounting.usage import Usage
from llmgwd.accounting.views import GROUPS
from llmgwd.api.access import key_auth
from llmgwd.api.base import API_PREFIX, ApiContext
from llmgwd.api.routes import api_subapp
from llmgwd.catalog import Catalog, KeyOwner
from llmgwd.console import app as console
from llmgwd.console.headers import CSP
from llmgwd.people.records import Scope
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.console.console_site import Browser, Nodes, Site

SECRET = b"u" * 32
SINCE = "2026-01-01"
COLS = ("requests", "prompt_tokens", "completion_tokens", "total_tokens", "spend")


async def _people(site: Site) -> None:
    """acme (teams web; projects web, app) and beta (project lab); vic a staff viewer, ada
    acme's admin, bea beta's admin, mel a plain member of acme; each their own key, and an
    admin key (ops)."""
    d = site.people
    for org in ("acme", "beta"):
        await d.create_org(org)
    await d.create_team("acme", "eng")
    await d.create_project("acme", "web", team="eng")
    await d.create_project("acme", "app")
    await d.create_project("beta", "lab")
    for name, staff, org, role in (
        ("vic", "viewer", "", ""),
        ("ada", None, "acme", "admin"),
        ("bea", None, "beta", "admin"),
        ("mel", None, "acme", "member"),
    ):
        user = await d.create_user(name)
        site.catalog.note_user(user)
        if staff:
            await d.set_staff(user.id, staff)  # type: ignore[arg-type]
        if org:
            await d.set_member("", user.id, Scope(org=org), role)  # type: ignore[arg-type]
        key, secret = await site.catalog.create_key(name, owner=KeyOwner(user=user.id))
        site.keys[name], site.key_ids[name] = secret, key.id
        site.key_ids["user:" + name] = user.id
    key, secret = await site.catalog.create_key("ops", "admin")
    site.keys["admin"], site.key_ids["admin"] = secret, key.id


async def _metered(site: Site, usage: Usage) -> None:
    """Requests through the meter: project keys of acme (web, app) and beta (lab), over two
    models and three days, one day's not flushed yet, and one before SINCE."""
    made = {}
    for org, project, maker in (
        ("acme", "web", "ada"),
        ("acme", "app", "ada"),
        ("beta", "lab", "bea"),
    ):
        owner = KeyOwner(user=site.key_ids["user:" + maker], org=org, project=project)
        key, _ = await site.catalog.create_key(f"{org}-{project}", owner=owner)
        made[project] = key.id
    site.key_ids.update(made)
    for day, project, model, prompt, completion, picos in (
        ("2026-01-03", "web", "smol", 100, 20, 1_500_000_000_000),
        ("2026-01-03", "web", "smol", 7, 3, 100_000_000_000),
        ("2026-01-04", "web", "tiny", 50, 50, 0),
        ("2026-01-04", "app", "smol", 9, 1, 300_000_000_000),
        ("2026-01-05", "lab", "tiny", 1000, 400, 2_000_000_000_000),
        ("2025-12-31", "lab", "smol", 5, 5, 10_000_000_000),
    ):
        usage.add((day, made[project], model), prompt, completion, picos)
    await usage.flush()
    usage.add(("2026-01-06", made["app"], "tiny"), 11, 13, 700_000_000_000)  # not flushed


@asynccontextmanager
async def serving() -> AsyncIterator[tuple[Site, Usage]]:
    """The client port's /api/v1 and /console with a meter the test counts into."""
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    usage = Usage(store)
    ctx = ApiContext(
        catalog=catalog, nodes=Nodes(), mint_token=lambda: "t", join_url="", usage=usage
    )
    app = web.Application()
    api = api_subapp(ctx, key_auth(catalog))
    app.add_subapp(API_PREFIX, api)
    console.mount(app, console.make(api, catalog, SECRET, tls=False))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    site = Site(str(server.make_url("")).rstrip("/"), catalog, Nodes())
    await _people(site)
    await _metered(site, usage)
    try:
        yield site, usage
    finally:
        await server.close()
        await store.close()


@pytest.fixture
async def served() -> AsyncIterator[tuple[Site, Usage]]:
    async with serving() as both:
        yield both


@pytest.fixture
def site(served: tuple[Site, Usage]) -> Site:
    return served[0]


@pytest.fixture
async def browser(site: Site) -> AsyncIterator[Browser]:
    b = Browser(site)
    yield b
    await b.close()


class Figures(HTMLParser):
    """The usage table's rows as /api/v1 gives them: the grouping field's value and each
    column's figure (data-value), and the total row; and the organization choices."""

    def __init__(self, html: str, by: str) -> None:
        super().__init__()
        self.by = by
        self.rows: list[dict[str, Any]] = []
        self.total: dict[str, Any] = {}
        self.orgs: list[str] = []
        self._row: dict[str, Any] | None = None
        self._select = ""
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "tr" and "data-group" in a:
            self._row = {self.by: a["data-group"]}
            self.rows.append(self._row)
        elif tag == "tr" and "data-total" in a:
            self._row = self.total
        elif tag == "td" and self._row is not None and "data-col" in a:
            col, value = a["data-col"], a["data-value"]
            self._row[col] = float(value) if col == "spend" else int(value)
        elif tag == "select":
            self._select = a.get("name", "")
        elif tag == "option" and self._select == "org":
            self.orgs.append(a.get("value", ""))


def _api_rows(report: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """/api/v1's rows in the page's terms: the grouping field's value and the figures."""
    by = report["by"]
    rows = [{by: r.get(by, ""), **{c: r[c] for c in COLS}} for r in report["rows"]]
    return rows, {c: report["total"][c] for c in COLS}


async def _api(site: Site, role: str, path: str) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {site.keys[role]}"}
    async with (
        aiohttp.ClientSession() as s,
        s.get(site.url + API_PREFIX + path, headers=headers) as r,
    ):
        return r.status, await r.json()


async def _page(browser: Browser, query: str) -> tuple[aiohttp.ClientResponse, str]:
    return await browser.get("/console/usage?" + query)


@pytest.mark.parametrize("role", ["admin", "vic"])
async def test_the_figures_are_api_v1s_for_every_grouping(
    browser: Browser, site: Site, role: str
) -> None:
    await browser.sign_in(role)
    for by in GROUPS:
        r, html = await _page(browser, f"by={by}&since={SINCE}")
        assert r.status == 200, by
        status, report = await _api(site, role, f"/usage?by={by}&since={SINCE}")
        assert status == 200
        page = Figures(html, by)
        assert (page.rows, page.total) == _api_rows(report), by
        assert page.rows, by  # the meter's figures are there, not an empty table
    _, html = await _page(browser, f"by=org&since={SINCE}")
    assert {r["org"]: r["requests"] for r in Figures(html, "org").rows} == {"acme": 5, "beta": 1}


async def test_the_default_period_is_api_v1s_too(
    browser: Browser, served: tuple[Site, Usage]
) -> None:
    site, usage = served
    today = time.strftime("%Y-%m-%d", time.gmtime())
    usage.add((today, site.key_ids["web"], "smol"), 3, 4, 5_000_000_000)
    await browser.sign_in("admin")
    _, html = await _page(browser, "")
    _, report = await _api(site, "admin", "/usage")
    page = Figures(html, report["by"])
    assert (page.rows, page.total) == _api_rows(report)
    assert page.total["requests"] == 1 and report["since"] == today[:8] + "01"
    assert f'name="since" value="{report["since"]}"' in html


async def test_an_org_admin_sees_only_their_organizations_usage(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("ada")
    assert (await _api(site, "ada", "/usage"))[0] == 403  # not every organization's
    r, html = await _page(browser, f"by=key&since={SINCE}")
    assert r.status == 200
    _, report = await _api(site, "ada", f"/orgs/acme/usage?by=key&since={SINCE}")
    page = Figures(html, "key")
    assert (page.rows, page.total) == _api_rows(report)
    assert {r["key"] for r in page.rows} == {site.key_ids["web"], site.key_ids["app"]}
    assert site.key_ids["lab"] not in html and "beta" not in html
    r, html = await _page(browser, f"org=beta&by=key&since={SINCE}")  # forged: not theirs
    assert r.status == 403 and site.key_ids["lab"] not in html
    assert (await _api(site, "ada", "/orgs/beta/usage"))[0] == 403


async def test_a_viewer_chooses_any_organization_or_every_one(browser: Browser, site: Site) -> None:
    await browser.sign_in("vic")
    _, html = await _page(browser, f"org=beta&by=project&since={SINCE}")
    page = Figures(html, "project")
    assert page.orgs == ["", "acme", "beta"]
    _, report = await _api(site, "vic", f"/orgs/beta/usage?by=project&since={SINCE}")
    assert (page.rows, page.total) == _api_rows(report)
    assert [r["project"] for r in page.rows] == ["beta/lab"]


async def test_a_member_who_may_read_no_usage_is_refused(browser: Browser, site: Site) -> None:
    await browser.sign_in("mel")
    r, html = await _page(browser, "")
    assert r.status == 403 and "may read no organization" in html
    assert (await _api(site, "mel", "/orgs/acme/usage"))[0] == 403


async def test_the_page_keeps_the_strict_policy_and_draws_from_static_files(
    browser: Browser, site: Site
) -> None:
    r, _ = await _page(browser, "")
    assert r.status == 303 and r.headers["Location"] == "/console/login"
    await browser.sign_in("admin")
    r, html = await _page(browser, f"since={SINCE}")
    assert r.headers["Content-Security-Policy"] == CSP
    assert r.headers["Cache-Control"] == "no-store"
    assert "<script>" not in html and " style=" not in html and " on" + "load=" not in html
    assert 'aria-current="page">Usage<' in html
    for path in ("usage.js", "uPlot.iife.min.js", "uPlot.min.css", "usage.css"):
        assert f'"/console/static/{path}"' in html
        r, body = await browser.get("/console/static/" + path)
        assert r.status == 200 and body, path


@pytest.mark.parametrize(
    "query, words",
    [
        ("since=2026-13-01", "YYYY-MM-DD"),
        ("since=yesterday", "YYYY-MM-DD"),
        ("by=colour", "must be one of"),
    ],
)
async def test_a_bad_period_or_grouping_is_the_consoles_400_page(
    browser: Browser, query: str, words: str
) -> None:
    await browser.sign_in("admin")
    r, html = await _page(browser, query)
    assert r.status == 400
    assert words in html and 'role="alert"' in html
    assert r.headers["Content-Security-Policy"] == CSP
