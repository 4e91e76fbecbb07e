"""The console's organization page as a browser sees it: an organization's admin makes a project
and a key through its forms (the key's secret shown once, on the answer, never after nor in the
log), each role is drawn the forms the rule table lets it send there, another organization's
admin sees nothing of it and their forged forms get /api/v1's 403, and bad input is a 4xx page."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator

import aiohttp
import pytest

from llmgwd import auth
from llmgwd.api.routes import TABLE
from llmgwd.catalog import KeyOwner
from llmgwd.console.headers import CSP
from llmgwd.people.records import Scope
from tests.llmgwd.console.console_site import Browser, Forms, Site, csrf_of, serving

ORG = "/console/org/acme"


async def more_people(site: Site) -> None:
    """acme's team eng, its projects web (of eng) and app; beta, its project lab and its admin
    bea; mel, a plain member of acme, of eng and of web; a key of web made by ada."""
    d = site.people
    await d.create_org("beta")
    await d.create_team("acme", "eng")
    await d.create_project("acme", "web", team="eng")
    await d.create_project("acme", "app")
    await d.create_project("beta", "lab")
    for name, org, role in (("bea", "beta", "admin"), ("mel", "acme", "member")):
        user = await d.create_user(name)
        site.catalog.note_user(user)
        await d.set_member("", user.id, Scope(org=org), role)  # type: ignore[arg-type]
        key, secret = await site.catalog.create_key(name, owner=KeyOwner(user=user.id))
        site.keys[name], site.key_ids[name], site.key_ids["user:" + name] = secret, key.id, user.id
    mel = site.key_ids["user:mel"]
    await d.set_member("", mel, Scope(org="acme", kind="team", name="eng"), "member")
    await d.set_member("", mel, Scope(org="acme", kind="project", name="web"), "member")
    ada = (await d.user("ada")).id  # type: ignore[union-attr]
    key, _ = await site.catalog.create_key(
        "ci", owner=KeyOwner(user=ada, org="acme", project="web")
    )
    site.key_ids["ci"] = key.id


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    async with serving() as s:
        await more_people(s)
        yield s


@pytest.fixture
async def browser(site: Site) -> AsyncIterator[Browser]:
    b = Browser(site)
    yield b
    await b.close()


def route_forms(html: str) -> list[dict[str, str]]:
    """The page's forms that send a route (sign-out's is none)."""
    return [f for f in Forms(html).forms if "route" in f]


def form_of(html: str, route: str, **path: str) -> dict[str, str]:
    """The page's form sending route with these path parameters."""
    for f in route_forms(html):
        if f["route"] == route and all(f.get("path." + k) == v for k, v in path.items()):
            return f
    raise AssertionError(f"no form {route} {path}")


async def send(b: Browser, form: dict[str, str], **body: str) -> tuple[aiohttp.ClientResponse, str]:
    fields = {k: v for k, v in form.items() if k != "action"}
    return await b.post(form["action"], {**fields, **body})


async def test_an_org_admin_makes_a_project_and_a_key_whose_secret_is_shown_once(
    browser: Browser, site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await browser.sign_in("org-admin")
    r, _ = await browser.get("/console/org")
    assert r.status == 303 and r.headers["Location"] == ORG  # their one organization
    r, html = await browser.get(ORG)
    assert r.status == 200 and r.headers["Content-Security-Policy"] == CSP
    add = form_of(html, "POST /orgs/{org}/projects", org="acme")
    r, _ = await send(browser, add, **{"body.name": "docs", "body.team": "eng", "body.title": ""})
    assert r.status == 303 and r.headers["Location"] == ORG
    projects = await site.people.projects("acme")
    assert ("docs", "eng") in {(p.name, p.team) for p in projects}
    _, html = await browser.get(ORG)
    make = form_of(html, "POST /orgs/{org}/projects/{project}/keys", org="acme", project="docs")
    assert make["action"] == "/console/made"
    r, answer = await send(browser, make, **{"body.name": "laptop"})
    assert r.status == 201 and r.headers["Cache-Control"] == "no-store"
    secret = re.search(r"<code>([^<]+)</code>", answer)
    assert secret is not None
    key = site.catalog.authenticate(secret.group(1))
    assert key is not None and (key.name, key.org, key.project) == ("laptop", "acme", "docs")
    for path in (ORG, "/console/people", "/console/org"):
        r, html = await browser.get(path)
        assert secret.group(1) not in html, path  # shown once: never again
    assert "laptop" in (await browser.get(ORG))[1]  # listed, without its secret
    assert "Set-Cookie" not in r.headers or secret.group(1) not in r.headers["Set-Cookie"]
    assert secret.group(1) not in caplog.text


async def test_each_role_is_drawn_the_org_forms_the_rule_table_allows(site: Site) -> None:
    """Per role, the routes of the page's forms are exactly the routes under /orgs/{org} that
    the rule table lets that person send (staff roles, the org's admin, a plain member)."""
    roles = site.people
    writes = [r for r in TABLE if r.method != "GET" and r.path.startswith("/orgs/{org}")]
    where = {"org": "acme", "team": "eng", "project": "web", "name": "web", "user": "u"}
    for role in ("admin", "operator", "viewer", "org-admin", "mel"):
        b = Browser(site)
        try:
            await b.sign_in(role)
            r, html = await b.get(ORG)
            assert r.status == 200, role
            drawn = {f["route"] for f in route_forms(html)}
        finally:
            await b.close()
        key = site.catalog.authenticate(site.keys[role])
        assert key is not None
        who = auth.of_key(key)
        expected = set()
        for route in writes:
            path = {k: v for k, v in where.items() if f"{{{k}}}" in route.path}
            if await auth.allowed(who, route.rule, path, roles):
                expected.add(f"{route.method} {route.path}")
        assert drawn == expected, role
    assert not expected - {"POST /orgs/{org}/projects/{project}/keys"}  # mel: their own key


async def test_a_viewer_reads_the_org_without_a_singleform_of(browser: Browser) -> None:
    await browser.sign_in("viewer")
    r, html = await browser.get(ORG)
    assert r.status == 200
    assert route_forms(html) == []
    assert "web" in html and "eng" in html and "ci" in html  # projects, teams, keys


async def test_another_org_s_admin_sees_nothing_of_it_and_a_forged_act_is_403(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("bea")
    for path in (ORG, ORG + "/"):
        r, html = await browser.get(path)
        assert r.status in (403, 404), path
        assert "web" not in html and "eng" not in html
    async with aiohttp.ClientSession() as s:  # as /api/v1 answers bea
        auth_ = {"Authorization": "Bearer " + site.keys["bea"]}
        async with s.get(site.url + "/api/v1/orgs/acme", headers=auth_) as api:
            assert (await browser.get(ORG))[0].status == api.status == 403
    r, _ = await browser.get("/console/org")
    assert r.headers["Location"] == "/console/org/beta"  # theirs alone
    _, html = await browser.get("/console/org/beta")
    token = csrf_of(html)
    forged = {
        "csrf": token,
        "route": "POST /orgs/{org}/projects",
        "back": ORG,
        "path.org": "acme",
        "body.name": "stolen",
    }
    r, _ = await browser.post("/console/act", forged)
    assert r.status == 403 and "Content-Security-Policy" in r.headers
    made = {
        "csrf": token,
        "route": "POST /orgs/{org}/projects/{project}/keys",
        "back": ORG,
        "path.org": "acme",
        "path.project": "web",
        "body.name": "mine",
        "once": "n" * 22,  # a nonce of the person's own page would do as well
    }
    r, _ = await browser.post("/console/made", made)
    assert r.status == 403
    assert "stolen" not in {p.name for p in await site.people.projects("acme")}
    assert not any(k.name == "mine" for k in site.catalog.keys())  # noqa: SIM118 (no dict)


async def test_bad_input_is_the_console_s_error_page_with_a_4xx(browser: Browser) -> None:
    await browser.sign_in("org-admin")
    _, html = await browser.get(ORG)
    add = form_of(html, "POST /orgs/{org}/projects", org="acme")
    for body in ({"body.name": "Not A Name!"}, {"body.name": "ok", "body.team": "no-such"}):
        r, page = await send(browser, add, **body)
        assert 400 <= r.status < 500, body
        assert "Content-Security-Policy" in r.headers and "<h1>" in page
    role = form_of(html, "PUT /orgs/{org}/members/{user}", org="acme")
    for user, status in (("", 400), ("nobody", 404)):
        r, _ = await send(browser, role, **{"path.user": user, "body.role": "admin"})
        assert r.status == status, user
    r, _ = await send(browser, role, **{"path.user": "mel", "body.role": "boss"})
    assert r.status == 400
    limits = form_of(html, "PATCH /orgs/{org}/limits", org="acme")
    r, _ = await send(browser, limits, **{"body.rpm": "-1"})
    assert r.status == 400
    make = form_of(html, "POST /orgs/{org}/projects/{project}/keys", org="acme", project="web")
    r, _ = await send(browser, make, **{"body.name": "ab" * 40})
    assert r.status == 400
    r, _ = await send(browser, make, **{"route": "DELETE /orgs/{org}", "body.name": "x"})
    assert r.status == 400  # /console/made sends only routes that make a key
    r, _ = await browser.get("/console/org/no-such-org")
    assert r.status == 403  # as /api/v1 answers one who is no member of it


async def test_staff_get_a_404_for_an_org_that_is_not(browser: Browser) -> None:
    await browser.sign_in("admin")
    r, page = await browser.get("/console/org/no-such-org")
    assert r.status == 404 and "no-such-org" in page
    r, page = await browser.get("/console/org")
    assert r.status == 200 and "/console/org/beta" in page and "/console/org/acme" in page


async def test_an_org_admin_sets_limits_and_roles_by_theroute_forms(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("org-admin")
    _, html = await browser.get(ORG)
    limits = form_of(html, "PATCH /orgs/{org}/limits/projects/{name}", org="acme", name="web")
    values = {"body.rpm": "60", "body.tpm": "0", "body.budget_tokens": "1000"}
    values |= {"body.budget_tokens_per": "month", "body.budget_spend": "2.5"}
    r, _ = await send(browser, limits, **values, **{"body.budget_spend_per": "day"})
    assert r.status == 303
    async with aiohttp.ClientSession() as s:
        auth_ = {"Authorization": "Bearer " + site.keys["org-admin"]}
        async with s.get(site.url + "/api/v1/orgs/acme/limits", headers=auth_) as api:
            levels = {v["level"]: v["limits"] for v in await api.json()}
    web = levels["project:acme:web"]
    assert (web["rpm"], web["budget_tokens"], web["budget_tokens_per"]) == (60, 1000, "month")
    _, html = await browser.get(ORG)
    assert 'value="60"' in html  # the form shows the limits as they are now
    role = form_of(html, "PUT /orgs/{org}/members/{user}", org="acme")
    r, _ = await send(browser, role, **{"path.user": "mel", "body.role": "manager"})
    assert r.status == 303
    mel = site.key_ids["user:mel"]
    assert await site.people.role_in(mel, "acme") == "manager"
