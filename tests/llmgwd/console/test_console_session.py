"""The console's sign-in as a browser sees it: the cookie's attributes, a tampered, expired or
revoked session refused, sign-out, and no key in the log."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from llmgwd.console.session import COOKIE, Sessions, derived
from tests.llmgwd.console.console_site import Browser, Site, csrf_of, serving


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    async with serving() as s:
        yield s


@pytest.fixture
async def browser(site: Site) -> AsyncIterator[Browser]:
    b = Browser(site)
    yield b
    await b.close()


async def test_the_session_cookie_is_httponly_strict_bounded_and_never_the_key(
    browser: Browser, site: Site
) -> None:
    r, _ = await browser.log_in(site.keys["admin"])
    assert r.status == 303 and r.headers["Location"] == "/console/"
    cookie = r.cookies[COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Strict"
    assert cookie["path"] == "/console" and cookie["max-age"] == str(8 * 3600)
    assert not cookie["secure"]  # no TLS on this port
    assert site.keys["admin"] not in cookie.value and site.key_ids["admin"] in cookie.value
    r, html = await browser.get("/console/")
    assert r.status == 200 and "key " + site.key_ids["admin"] in html


def test_under_tls_the_cookie_is_sent_over_tls_only() -> None:
    response = web.Response()
    Sessions(derived(b"s" * 32, "session"), secure=True).set(response, "abc123")
    assert response.cookies[COOKIE]["secure"]


async def test_a_tampered_or_expired_cookie_is_no_session(browser: Browser, site: Site) -> None:
    sessions = Sessions(derived(b"s" * 32, "session"), secure=False)
    good = sessions.value(site.key_ids["admin"])
    other = sessions.value(site.key_ids["viewer"])
    tampered = good.replace(site.key_ids["admin"], site.key_ids["viewer"])
    expired = sessions.value(site.key_ids["admin"], now=time.time() - 9 * 3600)
    forged = Sessions(derived(b"x" * 32, "session"), secure=False).value(site.key_ids["admin"])
    for value, ok in ((good, True), (other, True), (tampered, False), (expired, False),
                      (forged, False), ("", False)):  # fmt: skip
        browser.session.cookie_jar.clear()
        browser.session.cookie_jar.update_cookies({COOKIE: value})
        r, _ = await browser.get("/console/")
        assert (r.status == 200) == ok, value
        if not ok:
            assert r.status == 303 and r.headers["Location"] == "/console/login"


async def test_a_revoked_key_ends_its_sessions_at_once(browser: Browser, site: Site) -> None:
    await browser.sign_in("admin")
    assert (await browser.get("/console/models"))[0].status == 200
    await site.catalog.revoke_key(site.key_ids["admin"])
    r, _ = await browser.get("/console/models")
    assert r.status == 303 and r.headers["Location"] == "/console/login"


async def test_a_key_not_valid_or_for_v1_only_signs_nobody_in(browser: Browser, site: Site) -> None:
    r, html = await browser.log_in("sk-llmgw-nothing")
    assert r.status == 401 and COOKIE not in r.cookies and "not valid" in html
    r, html = await browser.log_in(site.keys["v1"])
    assert r.status == 403 and COOKIE not in r.cookies and "/v1 only" in html


async def test_sign_out_ends_the_session_and_needs_the_form_token(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("viewer")
    _, html = await browser.get("/console/")
    assert (await browser.post("/console/logout", {}))[0].status == 403
    r, _ = await browser.post("/console/logout", {"csrf": csrf_of(html)})
    assert r.status == 303 and r.headers["Location"] == "/console/login"
    assert (await browser.get("/console/"))[0].status == 303


async def test_no_key_reaches_the_log(
    browser: Browser, site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    canary = "sk-llmgw-canary" + "Q" * 30
    await browser.log_in(canary)
    await browser.sign_in("admin")
    _, html = await browser.get("/console/models")
    form = {"csrf": csrf_of(html), "route": "POST /models/{name}/stop", "path.name": canary}
    await browser.post("/console/act", form)
    await browser.post("/console/act", {"csrf": "no", "key": canary})
    text = caplog.text
    assert "signed in" in text  # the log says who, by the key's id
    assert canary not in text and site.keys["admin"] not in text


async def test_a_sign_in_without_its_page_s_token_is_refused(browser: Browser, site: Site) -> None:
    key = site.keys["admin"]
    r, page = await browser.post("/console/login", {"key": key})
    assert r.status == 403 and COOKIE not in r.cookies and "token" in page
    _, html = await browser.get("/console/login")
    token = csrf_of(html)
    _, html = await browser.get("/console/login")  # another page: another nonce
    r, _ = await browser.post("/console/login", {"key": key, "csrf": token})
    assert r.status == 403 and COOKIE not in r.cookies
    r, _ = await browser.post("/console/login", {"key": key, "csrf": csrf_of(html)})
    assert r.status == 303 and COOKIE in r.cookies
