"""The console under a hostile browser: tokens and cookies of other than ASCII, a failing error
page, HSTS, forms naming routes the console draws none for, a "made" page sent twice, sign-out
ending the session on the server, and the provider's error in the log."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path
from unittest import mock

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import make_mocked_request
from yarl import URL

from llmgw.config import ClientPort, ClusterPort, ServerConfig
from llmgwd.console import base, pages
from llmgwd.console.ended import ENDED
from llmgwd.console.headers import CSP, TLS, to_https
from llmgwd.console.session import COOKIE, FLASH
from llmgwd.daemon import Daemon
from llmgwd.scim.token import SCIM as SCIM_TOKEN
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


async def test_a_form_token_of_other_than_ascii_is_a_403_not_a_500(browser: Browser) -> None:
    await browser.get("/console/login")  # its nonce cookie
    r, html = await browser.post("/console/login", {"key": "k", "csrf": "é"})
    assert r.status == 403 and "token" in html


async def test_a_flash_cookie_of_other_than_ascii_is_no_flash(browser: Browser) -> None:
    browser.session.cookie_jar.update_cookies({FLASH: "aGk.é"})
    r, _ = await browser.get("/console/login")
    assert r.status == 200


async def test_an_error_page_that_fails_is_plain_text_with_the_headers(
    browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    await browser.sign_in("admin")

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("no template")

    monkeypatch.setattr(pages, "render", broken)
    monkeypatch.setattr(base, "render", broken)
    r, text = await browser.get("/console/")
    assert r.status == 500 and text == "500: internal error"
    assert r.headers["Content-Security-Policy"] == CSP
    assert r.headers["Cache-Control"] == "no-store"


async def test_hsts_where_the_client_port_has_tls() -> None:
    async with serving(tls=True) as site:
        b = Browser(site)
        r, _ = await b.get("/console/login")
        await b.close()
    assert r.headers["Strict-Transport-Security"] == "max-age=31536000"


async def test_no_hsts_without_tls(browser: Browser) -> None:
    r, _ = await browser.get("/console/login")
    assert "Strict-Transport-Security" not in r.headers


async def test_act_sends_only_the_routes_the_console_s_forms_send(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("admin")
    _, html = await browser.get("/console/")
    token = csrf_of(html)
    keys = len(site.catalog.keys())
    scim = await site.catalog.store.get(SCIM_TOKEN.key)
    for route, body in (("POST /keys", {"body.name": "lost"}), ("POST /scim/token", {})):
        form = {"csrf": token, "route": route, "back": "/console/people", **body}
        r, html = await browser.post("/console/act", form)
        assert r.status == 400 and "may send" in html, route
    assert len(site.catalog.keys()) == keys  # no key made whose secret nobody saw
    assert await site.catalog.store.get(SCIM_TOKEN.key) == scim  # the SCIM token not rotated
    # A route the console's forms do send still goes.
    form = {"csrf": token, "route": "POST /models/{name}/stop", "path.name": "smol"}
    r, _ = await browser.post("/console/act", form)
    assert r.status == 303


async def test_sign_out_ends_a_key_s_session_on_the_server(browser: Browser, site: Site) -> None:
    await browser.sign_in("viewer")
    _, html = await browser.get("/console/")
    old = browser.session.cookie_jar.filter_cookies(URL(site.url + "/console/"))[COOKIE].value
    r, _ = await browser.post("/console/logout", {"csrf": csrf_of(html)})
    assert r.status == 303
    browser.session.cookie_jar.update_cookies({COOKIE: old})  # the cookie kept, sent again
    r, _ = await browser.get("/console/")
    assert r.status == 303 and r.headers["Location"] == "/console/login"
    # The pasted key is the person's own: it still works, and a new sign-in with it too.
    assert site.catalog.live_key(site.key_ids["viewer"]) is not None
    await browser.sign_in("viewer")
    assert (await browser.get("/console/"))[0].status == 200
    # The record of the ended session goes with the cookie's life (a lease: swept).
    [kv], _ = await site.catalog.store.range(ENDED, ENDED + "\xff")
    assert kv.lease != 0


async def test_the_made_page_sent_again_is_a_409_not_a_second_secret(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("admin")
    _, html = await browser.get("/console/people")
    [form] = [f for f in Forms(html).forms if f.get("route") == "POST /scim/token"]
    assert form["action"] == "/console/made" and form["once"]
    sent = {k: v for k, v in form.items() if k != "action"}
    r, page = await browser.post("/console/made", sent)
    assert r.status in (200, 201) and "New token made" in page
    shown = await site.catalog.store.get(SCIM_TOKEN.key)
    r, page = await browser.post("/console/made", sent)  # the answer page refreshed
    assert r.status == 409 and "sent already" in page
    assert await site.catalog.store.get(SCIM_TOKEN.key) == shown  # the token shown still works
    # Another load of the page has a fresh nonce: a new token is made on purpose only.
    _, html = await browser.get("/console/people")
    [again] = [f for f in Forms(html).forms if f.get("route") == "POST /scim/token"]
    assert again["once"] != form["once"]


@pytest.mark.parametrize(
    ("peer", "where"),
    [(("10.1.2.3", 5000), "https://llmgw.example:7700/console/models?x=1"), (("127.0.0.1", 1), "")],
)
async def test_plain_http_from_another_host_is_sent_to_https_where_the_port_has_tls(
    peer: tuple[str, int], where: str
) -> None:
    app = web.Application()
    app[TLS] = True
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: {
        "peername": peer,
        "socket": mock.Mock(family=socket.AF_INET),
    }.get(name, default)
    headers = {"Host": "llmgw.example:7700"}
    req = make_mocked_request(
        "GET", "/console/models?x=1", headers=headers, app=app, transport=transport
    )

    async def page(_r: web.Request) -> web.Response:
        return web.Response(text="page")

    if where:
        with pytest.raises(web.HTTPPermanentRedirect) as e:
            await to_https(req, page)
        assert str(e.value.location) == where
    else:
        answer = await to_https(req, page)
        assert isinstance(answer, web.Response) and answer.text == "page"


async def test_llmgwd_s_own_certificate_makes_the_console_s_cookies_secure(
    tmp_path: Path,
) -> None:
    cfg = ServerConfig(
        name="site", state_dir=str(tmp_path / "state"), socket=str(tmp_path / "llmgwd.sock"),
        client=ClientPort(listen="127.0.0.1:0"),
        cluster=ClusterPort(listen="127.0.0.1:0", advertise="https://127.0.0.1:17711"),
    )  # fmt: skip
    d = Daemon(cfg)
    await d.start()
    try:
        assert d.client_runner is not None
        host, port = d.client_runner.addresses[0][:2]
        async with ClientSession() as s, s.get(f"http://{host}:{port}/console/login") as r:
            await r.read()
            cookies = r.headers.getall("Set-Cookie", [])
            hsts = r.headers.get("Strict-Transport-Security")
    finally:
        await d.stop()
    assert r.status == 200 and hsts == "max-age=31536000"
    assert cookies and all("Secure" in c for c in cookies)
