"""Signing in to the console through an OpenID Connect provider nobody here wrote (PyPI's
oidc-provider-mock, on loopback), the browser's redirects followed by hand: the person lands
signed in, an organization's admin on their organization's page with no staff page in the
navigation; an answer of another sign-in (state) is the 400 error page; a deactivated user's
or a revoked key's session ends at once; without a provider no such sign-in is offered."""

from __future__ import annotations

import json
import logging
import re
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import oidc_provider_mock  # type: ignore[import-untyped]
import pytest
from aiohttp.test_utils import make_mocked_request
from yarl import URL

from llmgw.config import ClientPort, GroupRule, Oidc
from llmgwd.catalog import ApiKey
from llmgwd.console.base import OidcSignIn
from llmgwd.console.nav import LINKS
from llmgwd.console.oidc_signin import CALLBACK, challenge, redirect_uri
from llmgwd.console.session import COOKIE, PENDING
from llmgwd.people.oidc import Provider
from llmgwd.people.signin import SignIn
from tests.llmgwd.console.console_site import Browser, Site, csrf_of, serving

STAFF_PAGES = {"/console/", "/console/models", "/console/nodes", "/console/gpus"}
STAFF_PAGES |= {"/console/mirror", "/console/slurm"}
EVERYONE_S = {"/console/usage", "/console/people", "/console/org"}
SECRET = "console-client-secret-51c9"  # the provider takes any; it must never be logged


@pytest.fixture
def issuer() -> Iterator[str]:
    with oidc_provider_mock.run_server_in_thread() as server:
        yield f"http://localhost:{server.server_port}"


def put_user(issuer: str, sub: str, claims: dict[str, object]) -> None:
    """The provider's person sub, with these claims."""
    req = urllib.request.Request(
        f"{issuer}/users/{urllib.parse.quote(sub)}",
        data=json.dumps(claims).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 204


@pytest.fixture
async def site(issuer: str, tmp_path: Path) -> AsyncIterator[Site]:
    (tmp_path / "client-secret").write_text(SECRET + "\n")
    settings = Oidc(
        issuer=issuer,
        client_id="llmgw-console",
        client_secret_file=str(tmp_path / "client-secret"),
        scopes=("openid", "email", "profile"),
        rules=(GroupRule(group="acme-admins", org="acme", role="admin"),),
        session_ttl_s=3600,
    )
    async with serving(oidc=settings) as s:
        yield s


@pytest.fixture
async def browser(site: Site) -> AsyncIterator[Browser]:
    b = Browser(site)
    yield b
    await b.close()


async def at_provider(url: str, sub: str) -> str:
    """The person signs in at the provider's page as sub: where it sends the browser back."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, data={"sub": sub}, allow_redirects=False) as r,
    ):
        assert r.status in (302, 303), await r.text()
        return r.headers["Location"]


async def start(b: Browser) -> tuple[str, str]:
    """The sign-in page's provider link followed: the provider's authorization URL, and the
    pending sign-in's cookie as set."""
    _, html = await b.get("/console/login")
    m = re.search(r'<a href="(/console/login/oidc)">Sign in with ([^<]+)</a>', html)
    assert m, "the sign-in page offers no provider"
    r, _ = await b.get(m.group(1))
    assert r.status == 303
    return r.headers["Location"], r.headers["Set-Cookie"]


async def begin(b: Browser) -> str:
    """start's authorization URL."""
    return (await start(b))[0]


async def sign_in(b: Browser, sub: str) -> tuple[aiohttp.ClientResponse, str]:
    """The whole dance: the console, the provider, and back to the console's callback."""
    back = await at_provider(await begin(b), sub)
    assert back.startswith(b.site.url + CALLBACK + "?"), back
    return await b.get(back.removeprefix(b.site.url))


async def follow(b: Browser, path: str) -> tuple[str, str]:
    """GET path, following the console's redirects as a browser would: where it ends, its page."""
    for _ in range(5):
        r, html = await b.get(path)
        if r.status not in (302, 303):
            assert r.status == 200, (path, r.status, html)
            return path, html
        path = r.headers["Location"]
    raise AssertionError("too many redirects")


def login_keys(site: Site, user: str) -> list[ApiKey]:
    """The keys of this user's (their sign-ins' session keys)."""
    every = site.catalog.keys()
    return [k for k in every if k.user == user]


def nav_of(html: str) -> set[str]:
    """The navigation's links."""
    nav = re.search(r'<nav aria-label="Console">(.*?)</nav>', html, re.S)
    assert nav, "the page has no navigation"
    return set(re.findall(r'href="([^"]+)"', nav.group(1)))


async def test_an_org_admin_signs_in_through_the_provider_and_lands_on_their_org(
    issuer: str, site: Site, browser: Browser, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    put_user(issuer, "fay-sub", {"preferred_username": "fay", "groups": ["acme-admins"]})
    authorize, pending = await start(browser)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(authorize).query)
    assert query["redirect_uri"] == [site.url + CALLBACK]
    assert query["code_challenge_method"] == ["S256"] and query["client_id"] == ["llmgw-console"]
    assert pending.startswith(PENDING + "=") and "SameSite=Lax" in pending
    assert "HttpOnly" in pending and "Path=/console/login/oidc;" in pending
    verifier = pending.partition("=")[2].split(".")[3]
    assert query["code_challenge"] == [challenge(verifier)]
    r, html = await browser.get((await at_provider(authorize, "fay-sub")).removeprefix(site.url))
    assert r.status == 200 and "Signed in as fay" in html
    assert 'http-equiv="refresh" content="0; url=/console/"' in html
    landed, page = await follow(browser, "/console/")
    assert landed == "/console/org/acme"
    assert nav_of(page) == EVERYONE_S
    fay = await site.people.user("fay")
    assert fay is not None and fay.source == "oidc"
    [key] = login_keys(site, fay.id)
    assert key.expires_at > 0 and key.name == "login fay"
    assert f"key {key.id}" in page  # the session names that key, shown as the signed-in one
    assert PENDING not in {c.key for c in browser.session.cookie_jar}  # used once
    for secret in (verifier, SECRET, "sk-llmgw-", pending.split(";")[0]):
        assert secret not in caplog.text


async def test_an_answer_not_of_this_browser_s_sign_in_is_a_400(
    issuer: str, site: Site, browser: Browser
) -> None:
    put_user(issuer, "fay-sub", {"preferred_username": "fay", "groups": ["acme-admins"]})
    back = await at_provider(await begin(browser), "fay-sub")
    forged = re.sub(r"state=[^&]+", "state=another-sign-in-s-state-0123", back)
    r, html = await browser.get(forged.removeprefix(site.url))
    assert r.status == 400 and "not the one begun here" in html
    other = Browser(site)  # a browser that began no sign-in, sent the right answer
    try:
        r, _ = await other.get(back.removeprefix(site.url))
        assert r.status == 400
    finally:
        await other.close()
    r, _ = await browser.get("/console/org")
    assert r.status == 303 and r.headers["Location"] == "/console/login"  # not signed in
    assert await site.people.user("fay") is None


async def test_the_provider_s_refusal_is_shown_and_signs_no_one_in(
    site: Site, browser: Browser
) -> None:
    authorize = await begin(browser)
    state = urllib.parse.parse_qs(urllib.parse.urlsplit(authorize).query)["state"][0]
    r, html = await browser.get(f"{CALLBACK}?error=access_denied&state={state}")
    assert r.status == 403 and "access_denied" in html
    r, _ = await browser.get("/console/people")
    assert r.status == 303


async def test_a_deactivated_user_s_session_ends_at_once(
    issuer: str, site: Site, browser: Browser
) -> None:
    put_user(issuer, "fay-sub", {"preferred_username": "fay", "groups": ["acme-admins"]})
    r, _ = await sign_in(browser, "fay-sub")
    assert r.status == 200
    assert (await follow(browser, "/console/people"))[0] == "/console/people"
    fay = await site.people.user("fay")
    assert fay is not None
    site.catalog.note_user(await site.people.change_user(fay.id, active=False))
    r, _ = await browser.get("/console/people")
    assert r.status == 303 and r.headers["Location"] == "/console/login"


async def test_a_revoked_session_key_ends_the_console_s_session(
    issuer: str, site: Site, browser: Browser
) -> None:
    put_user(issuer, "gil-sub", {"preferred_username": "gil", "groups": []})
    assert (await sign_in(browser, "gil-sub"))[0].status == 200
    gil = await site.people.user("gil")
    assert gil is not None
    [key] = login_keys(site, gil.id)
    await site.catalog.revoke_key(key.id)
    r, _ = await browser.get("/console/people")
    assert r.status == 303 and r.headers["Location"] == "/console/login"


@pytest.mark.parametrize(
    ("role", "lands", "links"),
    [
        ("org-admin", "/console/org/acme", EVERYONE_S),
        ("viewer", "/console/", STAFF_PAGES | EVERYONE_S),
        ("admin", "/console/", STAFF_PAGES | EVERYONE_S),
    ],
)
async def test_staff_pages_are_in_staff_s_navigation_only(
    site: Site, browser: Browser, role: str, lands: str, links: set[str]
) -> None:
    await browser.sign_in(role)
    landed, html = await follow(browser, "/console/")
    assert landed == lands
    assert nav_of(html) == links
    assert {link.href for link in LINKS} == STAFF_PAGES | EVERYONE_S


async def test_without_a_provider_no_oidc_sign_in_is_offered() -> None:
    async with serving() as s:
        b = Browser(s)
        try:
            _, html = await b.get("/console/login")
            assert "Sign in with" not in html and 'name="key"' in html
            r, _ = await b.get("/console/login/oidc")
            assert r.status == 404
            r, _ = await b.get(CALLBACK + "?code=x&state=y")
            assert r.status == 404
        finally:
            await b.close()


def test_the_redirect_uri_is_under_the_client_port_s_public_url() -> None:
    assert ClientPort(public_url="https://llm.example.org").public_url
    for bad in ("https://llm.example.org/console", "ftp://llm.example.org", "llm.example.org"):
        with pytest.raises(ValueError, match="public_url"):
            ClientPort(public_url=bad)
    off = Oidc()
    store, keys = None, None  # a redirect URI reads neither
    public = "https://llm.example.org"
    oidc = OidcSignIn(Provider(off), SignIn(store, off), keys, public)  # type: ignore[arg-type]
    request = make_mocked_request("GET", "/console/login/oidc", headers={"Host": "10.0.0.5:7700"})
    assert redirect_uri(request, oidc) == "https://llm.example.org/console/login/oidc/callback"
    behind = OidcSignIn(oidc.provider, oidc.signin, oidc.keys, "")
    assert redirect_uri(request, behind) == "http://10.0.0.5:7700/console/login/oidc/callback"


async def test_sign_out_revokes_the_session_key_and_refuses_the_old_cookie(
    issuer: str, site: Site, browser: Browser
) -> None:
    put_user(issuer, "hal-sub", {"preferred_username": "hal", "groups": []})
    assert (await sign_in(browser, "hal-sub"))[0].status == 200
    hal = await site.people.user("hal")
    assert hal is not None
    _, html = await follow(browser, "/console/people")
    old = browser.session.cookie_jar.filter_cookies(URL(site.url + "/console/"))[COOKIE].value
    r, _ = await browser.post("/console/logout", {"csrf": csrf_of(html)})
    assert r.status == 303
    [key] = login_keys(site, hal.id)
    assert key.revoked  # no session key left behind to pile up
    browser.session.cookie_jar.update_cookies({COOKIE: old})  # the cookie kept, sent again
    r, _ = await browser.get("/console/people")
    assert r.status == 303 and r.headers["Location"] == "/console/login"


async def test_the_provider_s_error_cannot_forge_a_log_line(
    site: Site, browser: Browser, caplog: pytest.LogCaptureFixture
) -> None:
    authorize = await begin(browser)
    state = urllib.parse.parse_qs(urllib.parse.urlsplit(authorize).query)["state"][0]
    forged = urllib.parse.quote("denied\nconsole: admin signed in")
    with caplog.at_level(logging.INFO):
        r, _ = await browser.get(f"{CALLBACK}?error={forged}&state={state}")
    assert r.status == 403
    assert not any(line.startswith("console: admin") for line in caplog.text.splitlines())
