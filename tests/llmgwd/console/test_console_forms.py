"""The console's pages and forms as a browser sees them: the security headers on every page,
the forms each role is drawn (the routes the rule table lets it send, no more), and what comes
of a form sent without its token, forged by a viewer, or naming no route."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from llmgw import wire
from llmgwd.api.base import NodeInfo
from llmgwd.api.routes import TABLE
from llmgwd.catalog import Model, ModelUpstream
from llmgwd.console.forms import (
    MODEL_FORMS,
    NODE_FORMS,
    PROVIDER_ADD_FORM,
    PROVIDER_REMOVE_FORM,
)
from llmgwd.console.headers import CSP
from llmgwd.people.records import STAFF_ROLES
from tests.llmgwd.console.console_site import Browser, Forms, Site, csrf_of, serving


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    async with serving() as s:
        yield s


@pytest.fixture
async def browser(site: Site) -> AsyncIterator[Browser]:
    b = Browser(site)
    yield b
    await b.close()


async def test_every_page_has_the_strict_policy_and_is_never_cached(
    browser: Browser, site: Site
) -> None:
    pages = ["/console/login"]
    await browser.sign_in("admin")
    pages += ["/console/", "/console/models", "/console/no-such-page"]
    for path in pages:
        r, html = await browser.get(path)
        assert r.headers["Content-Security-Policy"] == CSP, path
        assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
        assert r.headers["X-Content-Type-Options"] == "nosniff", path
        assert r.headers["Referrer-Policy"] == "no-referrer", path
        assert r.headers["Cache-Control"] == "no-store", path
        assert "<script>" not in html and " style=" not in html, path  # nothing inline
    r, _ = await browser.get("/console/static/htmx.min.js")
    assert r.status == 200 and r.headers["Content-Security-Policy"] == CSP


def _allowed(role: str, method: str, path: str) -> bool:
    """Whether the rule table lets a staff role (or an org admin, of no staff role) send it."""
    route = next(r for r in TABLE if (r.method, r.path) == (method, path))
    return role in STAFF_ROLES and role in route.rule.staff


# Per page, its forms and the names ({name}) each is drawn for ("": a form of no name).
PAGES = {
    "/console/models": (
        (MODEL_FORMS, ("smol", "tiny", "up")),
        ((PROVIDER_ADD_FORM,), ("",)),
        ((PROVIDER_REMOVE_FORM,), ("up",)),
    ),
    "/console/nodes": ((NODE_FORMS, ("n1",)),),
}


@pytest.mark.parametrize("page", sorted(PAGES))
@pytest.mark.parametrize("role", ["admin", "operator", "viewer", "org-admin"])
async def test_each_role_is_drawn_exactly_the_forms_the_rule_table_allows(
    browser: Browser, site: Site, role: str, page: str
) -> None:
    site.nodes.items = [NodeInfo(name="n1", address="a", connected=True, last_seen=1, cores=8,
                                 memory_bytes=1 << 30)]  # fmt: skip
    upstream = ModelUpstream(
        protocol="openai", url="https://u.example/v1", model="m", credential=""
    )
    await site.catalog.add_model(Model(name="up", source="upstream:u", upstream=upstream))
    await browser.sign_in(role)
    r, html = await browser.get(page)
    if role == "org-admin":  # no staff role: the page's GET route's guard refuses them
        assert r.status == 403
        return
    assert r.status == 200
    drawn = {
        (f["route"], f.get("path.name", ""), f.get("path.action", ""))
        for f in Forms(html).forms
        if "route" in f
    }
    want = {
        (f"{f.method} {f.path}", name, f.fixed.get("action", ""))
        for forms, names in PAGES[page]
        for f in forms
        if _allowed(role, f.method, f.path)
        for name in names
    }
    assert drawn == want
    assert bool(want) == (role != "viewer")


def test_the_models_forms_tell_an_operator_from_an_admin() -> None:
    assert {_allowed("operator", f.method, f.path) for f in MODEL_FORMS} == {True, False}


async def test_an_admin_prices_a_model_and_an_operator_s_forged_price_is_403(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("admin")
    _, html = await browser.get("/console/models")
    price = next(f for f in Forms(html).forms if f.get("route", "").endswith("/price"))
    form = price | {"body.prompt": "0.5", "body.completion": "1.25"}
    assert (await browser.post("/console/act", form))[0].status == 303
    model = site.catalog.get(price["path.name"])
    assert model is not None and (model.price_prompt, model.price_completion) == (0.5, 1.25)
    operator = Browser(site)
    await operator.sign_in("operator")
    _, html = await operator.get("/console/models")
    form |= {"csrf": csrf_of(html), "body.prompt": "9"}
    r, page = await operator.post("/console/act", form)
    await operator.close()
    assert r.status == 403 and "may not PUT" in page
    model = site.catalog.get(price["path.name"])
    assert model is not None and model.price_prompt == 0.5


async def test_an_operator_stops_and_starts_a_model_by_its_forms(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("operator")
    _, html = await browser.get("/console/models")
    stop = next(f for f in Forms(html).forms if f.get("route", "").endswith("/stop"))
    r, _ = await browser.post("/console/act", stop)
    assert r.status == 303 and r.headers["Location"] == "/console/models"
    model = site.catalog.get(stop["path.name"])
    assert model is not None and model.replicas == 0
    r, html = await browser.get("/console/models")
    assert f"Done: POST /api/v1/models/{stop['path.name']}/stop" in html
    start = next(f for f in Forms(html).forms if f.get("route", "").endswith("/serve"))
    r, _ = await browser.post("/console/act", start | {"body.replicas": "3"})
    model = site.catalog.get(start["path.name"])
    assert r.status == 303 and model is not None and model.replicas == 3
    r, html = await browser.post("/console/act", start | {"body.replicas": "many"})
    assert r.status == 400 and "replicas" in html
    _, html = await browser.get("/console/models")
    context = next(f for f in Forms(html).forms if f.get("route", "").endswith("/context"))
    r, _ = await browser.post("/console/act", context | {"body.context": "4096"})
    model = site.catalog.get(context["path.name"])
    assert r.status == 303 and model is not None and model.context == 4096


async def test_a_form_without_its_token_or_with_another_is_refused(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("admin")
    _, html = await browser.get("/console/models")
    remove = next(f for f in Forms(html).forms if f.get("route", "").startswith("DELETE"))
    for token in (None, "0" * 64, csrf_of(html)[:-1]):
        form = {k: v for k, v in remove.items() if k != "csrf"}
        r, page = await browser.post("/console/act", form | ({"csrf": token} if token else {}))
        assert r.status == 403 and "token" in page
    assert site.catalog.get(remove["path.name"]) is not None
    r, _ = await browser.post("/console/act", remove)
    assert r.status == 303 and site.catalog.get(remove["path.name"]) is None


async def test_a_viewer_s_forged_form_gets_the_guard_s_403(browser: Browser, site: Site) -> None:
    await browser.sign_in("viewer")
    _, html = await browser.get("/console/models")
    assert not [f for f in Forms(html).forms if "route" in f]
    form = {"csrf": csrf_of(html), "route": "POST /models/{name}/stop", "path.name": "smol"}
    r, page = await browser.post("/console/act", form)
    assert r.status == 403 and "may not POST /api/v1/models/smol/stop" in page
    model = site.catalog.get("smol")
    assert model is not None and model.replicas == 1


@pytest.mark.parametrize(
    "route",
    [
        "POST /models/{name}/halt",  # no route
        "POST /models/{name}/stop ",  # not exactly one
        "post /models/{name}/stop",
        "GET /models",  # a read changes nothing
        "DELETE /models/smol",  # a path, not a record's
    ],
)
async def test_a_form_naming_no_route_of_the_table_is_a_400(
    browser: Browser, site: Site, route: str
) -> None:
    await browser.sign_in("admin")
    _, html = await browser.get("/console/models")
    form = {"csrf": csrf_of(html), "route": route, "path.name": "smol"}
    r, _ = await browser.post("/console/act", form)
    assert r.status == 400
    assert site.catalog.get("smol") is not None


async def test_path_parameters_must_be_the_route_s_own(browser: Browser, site: Site) -> None:
    await browser.sign_in("admin")
    _, html = await browser.get("/console/models")
    base = {"csrf": csrf_of(html), "route": "POST /models/{name}/stop"}
    for params in ({}, {"path.name": "smol", "path.other": "x"}, {"path.nam": "smol"}):
        r, _ = await browser.post("/console/act", base | params)
        assert r.status == 400, params
    r, _ = await browser.post("/console/act", base | {"path.name": "../keys"})
    assert r.status == 404  # one parameter, quoted whole: no model of that name
    model = site.catalog.get("smol")
    assert model is not None and model.replicas == 1


async def test_the_overview_shows_nodes_models_and_what_needs_attention(
    browser: Browser, site: Site
) -> None:
    failed = wire.ReplicaStatus(id="r1", model="smol", state="failed", message="exit 1")
    site.nodes.items = [
        NodeInfo(name="n1", address="a", connected=True, last_seen=1, cores=8,
                 memory_bytes=1, replicas=[failed], version="0.1.0", gpus=2),
        NodeInfo(name="n2", address="b", connected=False, last_seen=1, cores=8, memory_bytes=1),
    ]  # fmt: skip
    await browser.sign_in("viewer")
    r, html = await browser.get("/console/")
    assert r.status == 200
    assert "replica r1 of smol: exit 1" in html and "<strong>n2</strong>: node lost" in html
    assert "0 / 1" in html and "0.1.0" in html
    assert "<form" in html and "/console/act" not in html  # a viewer: sign-out only


async def test_htmx_polls_the_overview_s_live_part_alone(browser: Browser, site: Site) -> None:
    await browser.sign_in("viewer")
    _, html = await browser.get("/console/")
    assert 'id="live" hx-get="/console/" hx-trigger="every 5s"' in html
    async with browser.session.get(site.url + "/console/", headers={"HX-Request": "true"}) as r:
        part = await r.text()
    assert r.status == 200 and part.startswith('<div id="live"') and "<html" not in part
    assert "smol" in part and r.headers["Content-Security-Policy"] == CSP
    browser.session.cookie_jar.clear()
    async with browser.session.get(
        site.url + "/console/", headers={"HX-Request": "true"}, allow_redirects=False
    ) as r:
        assert r.headers["HX-Redirect"] == "/console/login"


async def test_a_viewer_s_forged_cordon_gets_the_guard_s_403(browser: Browser, site: Site) -> None:
    site.nodes.items = [NodeInfo(name="n1", address="a", connected=True, last_seen=1, cores=8,
                                 memory_bytes=1 << 30)]  # fmt: skip
    await browser.sign_in("viewer")
    _, html = await browser.get("/console/nodes")
    assert "n1" in html and not [f for f in Forms(html).forms if "route" in f]
    form = {"csrf": csrf_of(html), "route": "POST /nodes/{name}/{action:cordon|drain|uncordon}",
            "path.name": "n1", "path.action": "cordon"}  # fmt: skip
    r, page = await browser.post("/console/act", form)
    assert r.status == 403 and "may not POST /api/v1/nodes/n1/cordon" in page
    r, _ = await browser.post("/console/act", form | {"path.action": "reboot"})
    assert r.status == 400  # the record's pattern routes no other action
