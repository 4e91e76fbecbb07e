"""The console's people page as a browser sees it: staff see users, keys and their forms, an
organization's admin only their own organizations and keys, each role is drawn the forms the rule
table lets it send, a key's or the SCIM token's secret is shown on its answer once and nowhere
after, and bad input is the console's 4xx page."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator

import pytest

from llmgwd import auth
from llmgwd.api.routes import TABLE
from llmgwd.catalog import KeyOwner
from llmgwd.console.headers import CSP
from tests.llmgwd.console.console_site import Browser, Site, serving
from tests.llmgwd.console.test_org_page import form_of, more_people, route_forms, send

PEOPLE = "/console/people"
# The people page's routes: users, staff roles, organizations, keys, the SCIM token.
PATHS = {
    "/users",
    "/users/{user}",
    "/users/{user}/staff",
    "/users/{user}/limits",
    "/orgs",
    "/keys",
    "/keys/{key}",
    "/keys/{key}/limits",
    "/me/keys",
    "/me/keys/{key}",
    "/scim/token",
}


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    """The console's site, with beta, mel and bea (test_org_page's), and sam: a staff admin
    user with a key of their own."""
    async with serving() as s:
        await more_people(s)
        sam = await s.people.create_user("sam")
        s.catalog.note_user(sam)
        await s.people.set_staff(sam.id, "admin")
        key, secret = await s.catalog.create_key("sam", owner=KeyOwner(user=sam.id))
        s.keys["sam"], s.key_ids["sam"] = secret, key.id
        yield s


@pytest.fixture
async def browser(site: Site) -> AsyncIterator[Browser]:
    b = Browser(site)
    yield b
    await b.close()


def _secret(answer: str) -> str:
    m = re.search(r"<code>([^<]+)</code>", answer)
    assert m is not None, "the answer shows no secret"
    return m.group(1)


async def test_each_role_is_drawn_the_people_forms_the_rule_table_allows(site: Site) -> None:
    writes = [r for r in TABLE if r.method != "GET" and r.path in PATHS]
    where = {"user": "u", "key": "k"}
    for role in ("sam", "operator", "viewer", "org-admin", "mel"):
        b = Browser(site)
        try:
            await b.sign_in(role)
            r, html = await b.get(PEOPLE)
            assert r.status == 200 and r.headers["Content-Security-Policy"] == CSP, role
            drawn = {f["route"] for f in route_forms(html)}
        finally:
            await b.close()
        key = site.catalog.authenticate(site.keys[role])
        assert key is not None
        expected = set()
        for route in writes:
            path = {k: v for k, v in where.items() if f"{{{k}}}" in route.path}
            if await auth.allowed(auth.of_key(key), route.rule, path, site.people):
                expected.add(f"{route.method} {route.path}")
        assert drawn == expected, role
        if role == "viewer":  # their own keys alone, as the rule table lets every staff user
            assert drawn == {"POST /me/keys", "DELETE /me/keys/{key}"}
        if role == "sam":
            assert {"POST /users", "PUT /users/{user}/staff", "POST /scim/token"} <= drawn


async def test_staff_add_a_user_give_a_staff_role_and_deactivate_them(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("sam")
    _, html = await browser.get(PEOPLE)
    assert all(name in html for name in ("ada", "olga", "vic", "bea"))
    add = form_of(html, "POST /users")
    r, _ = await send(browser, add, **{"body.name": "zoe", "body.email": "z@example.org"})
    assert r.status == 303 and r.headers["Location"] == PEOPLE
    zoe = await site.people.user("zoe")
    assert zoe is not None and zoe.email == "z@example.org"
    _, html = await browser.get(PEOPLE)
    staff = form_of(html, "PUT /users/{user}/staff", user=zoe.id)
    r, _ = await send(browser, staff, **{"body.role": "operator"})
    assert r.status == 303 and await site.people.staff_role(zoe.id) == "operator"
    change = form_of(html, "PATCH /users/{user}", user=zoe.id)
    fields = {"body.email": "z@example.org", "body.active": "false", "body.external_id": ""}
    r, _ = await send(browser, change, **fields)
    assert r.status == 303
    zoe = await site.people.user("zoe")
    assert zoe is not None and not zoe.active
    assert "deactivated" in (await browser.get(PEOPLE))[1]


async def test_made_keys_and_the_scim_token_are_shown_once_and_never_logged(
    browser: Browser, site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await browser.sign_in("sam")
    _, html = await browser.get(PEOPLE)
    secrets = []
    for route, body in (
        ("POST /keys", {"body.name": "batch", "body.role": "user"}),
        ("POST /me/keys", {"body.name": "laptop"}),
        ("POST /scim/token", {}),
    ):
        form = form_of(html, route)
        assert form["action"] == "/console/made", route
        r, answer = await send(browser, form, **body)
        assert r.status == 201 and r.headers["Cache-Control"] == "no-store", route
        assert r.headers["Content-Security-Policy"] == CSP
        secrets.append(_secret(answer))
    batch, laptop, _scim = secrets
    assert site.catalog.authenticate(batch) is not None
    mine, sam = site.catalog.authenticate(laptop), await site.people.user("sam")
    assert mine is not None and sam is not None and mine.user == sam.id
    _, page = await browser.get(PEOPLE)
    assert "batch" in page and "laptop" in page  # listed, by name and prefix
    for s in secrets:
        assert s not in page  # never again
        assert s not in caplog.text


async def test_an_org_admin_sees_their_organizations_and_keys_only(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("org-admin")
    r, html = await browser.get(PEOPLE)
    assert r.status == 200
    assert 'href="/console/org/acme"' in html and "/console/org/beta" not in html
    assert 'id="users"' not in html  # GET /users is staff's
    assert 'id="keys"' not in html  # so is GET /keys
    assert "bea" not in html


async def test_bad_input_is_the_console_s_error_page_with_a_4xx(browser: Browser) -> None:
    await browser.sign_in("sam")
    _, html = await browser.get(PEOPLE)
    r, page = await send(browser, form_of(html, "POST /users"), **{"body.name": "Not A Name!"})
    assert r.status == 400 and r.headers["Content-Security-Policy"] == CSP and "<h1>" in page
    r, _ = await send(browser, form_of(html, "POST /users"), **{"body.name": "ada"})
    assert r.status == 409
    mine = form_of(html, "POST /me/keys")
    r, _ = await send(browser, mine, **{"body.name": ""})
    assert r.status == 400
    r, _ = await send(browser, mine, **{"body.name": "sam"})
    assert r.status == 409  # sam has a key of that name
    r, _ = await send(browser, mine, **{"csrf": "0" * 64, "body.name": "x"})
    assert r.status == 403  # not this session's form token
    scim = form_of(html, "POST /scim/token")
    r, _ = await send(browser, scim, **{"body.x": "1"})
    assert r.status == 400  # it takes no body


async def test_an_account_waiting_for_approval_is_shown_and_approved_there(
    browser: Browser, site: Site
) -> None:
    wes = await site.people.create_user("wes", source="oidc", approved=False)
    await browser.sign_in("sam")
    _, html = await browser.get(PEOPLE)
    assert "1 waiting for approval" in html and "<td>waiting for approval</td>" in html

    r, _ = await send(browser, form_of(html, "POST /users/{user}/approve", user=wes.id))

    assert r.status == 303 and r.headers["Location"] == PEOPLE
    now = await site.people.user("wes")
    assert now is not None and now.approved
    _, html = await browser.get(PEOPLE)
    assert "waiting for approval" not in html
