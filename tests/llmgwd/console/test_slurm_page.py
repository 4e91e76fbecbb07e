"""The console's Slurm page as a browser reads it: Slurm's settings and each of its nodes'
standing from GET /api/v1/slurm; the lend and reclaim forms each role may send (those the rule
table lets it, no more) and what sending them does; a viewer's forged lend and a bad one refused
in the console's error page."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import msgspec
import pytest

from llmgw.api_types import SlurmNodeView
from llmgwd import auth
from llmgwd.api.routes import TABLE
from llmgwd.console.headers import CSP
from llmgwd.console.slurm_page import SLURM_FORMS
from llmgwd.people.directory import Directory
from llmgwd.slurm.settings import SETTINGS, SettingsStore, SlurmSettings
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.console.console_site import Browser, Forms, Site, csrf_of, serving

STANDING = SlurmNodeView(
    name="dgx", status="lent", held=True, state="allocated", jobs=["4711"], version="24.05.3"
)
SET = SlurmSettings(enabled=True, controller="cp1", nodes=["dgx", "rtx"], lent=["dgx"])


@pytest.fixture
async def settings() -> AsyncIterator[SettingsStore]:
    store = await SqliteStore.open(":memory:")
    await store.put(SETTINGS, msgspec.json.encode(SET))
    yield SettingsStore(store)
    await store.close()


async def _serve(
    settings: SettingsStore, status: Callable[[], list[SlurmNodeView] | None]
) -> AsyncIterator[Site]:
    async with serving(slurm=settings, slurm_status=status) as s:
        yield s


@pytest.fixture
async def site(settings: SettingsStore) -> AsyncIterator[Site]:
    async for s in _serve(settings, lambda: [STANDING]):
        yield s


@pytest.fixture
async def browser(site: Site) -> AsyncIterator[Browser]:
    b = Browser(site)
    yield b
    await b.close()


async def _page(browser: Browser, role: str = "viewer") -> str:
    await browser.sign_in(role)
    r, html = await browser.get("/console/slurm")
    assert r.status == 200
    assert r.headers["Content-Security-Policy"] == CSP
    assert "<script>" not in html and " style=" not in html
    return html


async def test_the_settings_and_each_node_s_standing(browser: Browser) -> None:
    html = await _page(browser)
    assert "<dt>Slurm</dt><dd>on</dd>" in html and "<dt>Controller</dt><dd>cp1</dd>" in html
    assert '<dd class="standing">lent (held from llmgw\'s scheduler)</dd>' in html
    assert "allocated" in html and "4711" in html and "24.05.3" in html
    assert '<a href="/console/nodes/rtx">rtx</a>' in html
    assert '<dd class="standing">none known yet</dd>' in html  # rtx: no row yet


async def _allowed(site: Site, role: str, name: str) -> set[tuple[str, str]]:
    """The Slurm forms' routes (with their action) the rule table lets this role's key send
    for a node: auth.allowed over each Route record's rule, as /api/v1's guard decides."""
    key = site.catalog.live_key(site.key_ids[role])
    assert key is not None
    who, roles = auth.of_key(key), Directory(site.catalog.store)
    out = set()
    for form in SLURM_FORMS:
        route = next(r for r in TABLE if (r.method, r.path) == (form.method, form.path))
        if await auth.allowed(who, route.rule, {"name": name, **form.fixed}, roles):
            out.add((f"{route.method} {route.path}", form.fixed["action"]))
    return out


@pytest.mark.parametrize("role", ["admin", "operator", "viewer", "org-admin"])
async def test_each_role_is_drawn_exactly_the_slurm_forms_the_rule_table_allows(
    browser: Browser, site: Site, role: str
) -> None:
    await browser.sign_in(role)
    r, html = await browser.get("/console/slurm")
    if role == "org-admin":  # no staff role: GET /slurm's guard refuses them the page
        assert r.status == 403 and "4711" not in html
        return
    sent = [f for f in Forms(html).forms if f["action"] == "/console/act"]
    for name in ("dgx", "rtx"):
        drawn = {(f["route"], f["path.action"]) for f in sent if f["path.name"] == name}
        assert drawn == await _allowed(site, role, name)
    assert all(f["csrf"] == csrf_of(html) and f["back"] == "/console/slurm" for f in sent)
    assert bool(sent) == (role != "viewer")  # the table lets a viewer send none


def _form(html: str, name: str, action: str) -> dict[str, str]:
    (form,) = [
        f
        for f in Forms(html).forms
        if f.get("path.name") == name and f.get("path.action") == action
    ]
    return form


async def test_an_operator_lends_one_node_and_reclaims_another(
    browser: Browser, settings: SettingsStore
) -> None:
    html = await _page(browser, "operator")
    r, _ = await browser.post("/console/act", _form(html, "rtx", "lend"))
    assert r.status == 303 and r.headers["Location"] == "/console/slurm"
    assert (await settings.get()).lent == ["dgx", "rtx"]
    r, _ = await browser.post("/console/act", _form(html, "dgx", "reclaim"))
    assert r.status == 303 and (await settings.get()).lent == ["rtx"]
    _, html = await browser.get("/console/slurm")
    assert "Done: POST /api/v1/slurm/nodes/dgx/reclaim" in html


async def test_a_viewer_s_forged_lend_gets_the_guard_s_403(
    browser: Browser, settings: SettingsStore
) -> None:
    html = await _page(browser, "viewer")
    form = {"csrf": csrf_of(html), "route": "POST /slurm/nodes/{name}/{action:lend|reclaim}",
            "path.name": "rtx", "path.action": "lend", "back": "/console/slurm"}  # fmt: skip
    r, page = await browser.post("/console/act", form)
    assert r.status == 403 and "may not POST /api/v1/slurm/nodes/rtx/lend" in page
    assert r.headers["Content-Security-Policy"] == CSP
    assert (await settings.get()).lent == ["dgx"]


async def test_a_bad_lend_is_refused_in_the_error_page(
    browser: Browser, settings: SettingsStore
) -> None:
    html = await _page(browser, "operator")
    form = _form(html, "rtx", "lend")
    r, page = await browser.post("/console/act", form | {"path.action": "reboot"})
    assert r.status == 400 and '<p class="refusal" role="alert">' in page
    r, page = await browser.post("/console/act", form | {"path.name": "ghost"})
    assert r.status == 409 and "&#39;ghost&#39; is not one of Slurm&#39;s nodes" in page
    assert r.headers["Content-Security-Policy"] == CSP
    assert (await settings.get()).lent == ["dgx"]


async def test_htmx_polls_the_standing_alone(browser: Browser, site: Site) -> None:
    html = await _page(browser)
    assert 'id="live" hx-get="/console/slurm" hx-trigger="every 10s"' in html
    headers = {"HX-Request": "true"}
    async with browser.session.get(site.url + "/console/slurm", headers=headers) as r:
        part = await r.text()
    assert r.status == 200 and part.startswith('<div id="live"') and "<html" not in part
    assert "4711" in part and r.headers["Content-Security-Policy"] == CSP


async def test_a_standby_says_the_leader_knows_the_standing(settings: SettingsStore) -> None:
    async for site in _serve(settings, lambda: None):
        b = Browser(site)
        try:
            html = await _page(b)
        finally:
            await b.close()
    assert "This control plane is a standby" in html and "known to the leader" in html


async def test_without_slurm_kept_here_the_page_says_so() -> None:
    async with serving() as site:
        b = Browser(site)
        try:
            html = await _page(b, "admin")
        finally:
            await b.close()
    assert "Slurm is not kept by this control plane." in html and "/console/act" not in html
