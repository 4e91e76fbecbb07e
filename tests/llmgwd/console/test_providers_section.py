"""The models page's external providers as a staff admin sees and sends them: listed without their
credential, added by a form whose credential no page, flash or log shows after, refused with
the API's words over plain http:// from the network, and removed only with the box ticked."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from llmgwd.api import providers
from llmgwd.clientport import forwarded
from llmgwd.console import pages
from llmgwd.providers.credentials import Credentials
from tests.llmgwd.console.console_site import Browser, Forms, Site, serving

CREDENTIAL = "sk-console-3f9a7c1d2e"
ADD = "POST /providers"
REMOVE = "DELETE /providers/{name}"


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    async with serving(credentials=Credentials(b"k" * 32)) as s:
        yield s


@pytest.fixture
async def admin(site: Site) -> AsyncIterator[Browser]:
    b = Browser(site)
    await b.sign_in("admin")
    yield b
    await b.close()


def _form(html: str, route: str) -> dict[str, str]:
    return next(f for f in Forms(html).forms if f.get("route") == route)


def _filled(html: str) -> dict[str, str]:
    return _form(html, ADD) | {
        "body.name": "gpt",
        "body.protocol": "openai",
        "body.url": "https://api.example.com/v1",
        "body.model": "gpt-4o-mini",
        "body.credential": CREDENTIAL,
        "body.context": "0",
        "body.max_tokens": "0",
    }


async def test_an_admin_adds_a_provider_and_no_page_or_log_shows_its_credential(
    site: Site, admin: Browser, caplog: pytest.LogCaptureFixture
) -> None:
    _, html = await admin.get("/console/models")
    assert 'type="password" name="body.credential"' in html and "No external provider" in html
    caplog.set_level(logging.DEBUG)
    r, _ = await admin.post("/console/act", _filled(html))
    assert r.status == 303 and r.headers["Location"] == "/console/models"
    model = site.catalog.get("gpt")
    assert model is not None and model.upstream is not None
    assert CREDENTIAL not in model.upstream.credential  # sealed
    seen = []
    for path in ("/console/models", "/console/models", "/console/models/gpt", "/console/"):
        _, page = await admin.get(path)  # the first with the flash
        seen.append(page)
    assert "Done: POST /api/v1/providers" in seen[0]
    for cell in ("gpt", "openai", "https://api.example.com/v1", "gpt-4o-mini"):
        assert f"<td>{cell}</td>" in seen[1]
    assert all(CREDENTIAL not in page for page in seen)
    assert CREDENTIAL not in caplog.text


async def test_over_plain_http_from_the_network_the_form_is_not_drawn_and_the_api_refuses(
    site: Site, admin: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, html = await admin.get("/console/models")
    form = _filled(html)
    monkeypatch.setattr(pages, "private_path", lambda request: False)
    _, html = await admin.get("/console/models")
    assert "open the console over https://" in html
    assert not [f for f in Forms(html).forms if f.get("route") == ADD]
    monkeypatch.setattr(providers, "private_path", lambda request: False)
    r, page = await admin.post("/console/act", form)  # a page loaded before, sent now
    assert r.status == 403 and "add it over https://" in page
    assert CREDENTIAL not in page and site.catalog.get("gpt") is None


async def test_an_admin_removes_a_provider_by_its_confirmed_form(
    site: Site, admin: Browser
) -> None:
    _, html = await admin.get("/console/models")
    assert (await admin.post("/console/act", _filled(html)))[0].status == 303
    _, html = await admin.get("/console/models")
    assert 'type="checkbox" name="confirm" value="yes" required' in html
    remove = _form(html, REMOVE)
    assert remove["path.name"] == "gpt"
    r, _ = await admin.post("/console/act", remove | {"confirm": "yes"})
    assert r.status == 303 and site.catalog.get("gpt") is None
    _, html = await admin.get("/console/models")
    assert "No external provider" in html and not [
        f for f in Forms(html).forms if f.get("route") == REMOVE
    ]


async def test_an_operator_sees_providers_but_is_drawn_no_provider_form(
    site: Site, admin: Browser
) -> None:
    _, html = await admin.get("/console/models")
    await admin.post("/console/act", _filled(html))
    operator = Browser(site)
    await operator.sign_in("operator")
    _, html = await operator.get("/console/models")
    await operator.close()
    assert "<td>https://api.example.com/v1</td>" in html and CREDENTIAL not in html
    assert not [f for f in Forms(html).forms if f.get("route") in (ADD, REMOVE)]


@web.middleware
async def _proxied(request: web.Request, handler: Handler) -> web.StreamResponse:
    """What the client port takes of a request a trusted proxy brings from 203.0.113.9."""
    request[forwarded.CLIENT], request[forwarded.PROXIED] = "203.0.113.9", True
    return await handler(request)


@pytest.mark.parametrize("proto", ["http", "https"])
async def test_behind_a_trusted_proxy_the_browser_s_hop_decides_not_the_proxy_s(
    proto: str,
) -> None:
    async with serving(credentials=Credentials(b"k" * 32), middlewares=[_proxied]) as site:
        admin = Browser(site)
        admin.session.headers["X-Forwarded-Proto"] = "https"
        await admin.sign_in("admin")
        _, html = await admin.get("/console/models")
        form = _filled(html)
        admin.session.headers["X-Forwarded-Proto"] = proto
        _, html = await admin.get("/console/models")
        r, page = await admin.post("/console/act", form)
        await admin.close()
        drawn = any(f.get("route") == ADD for f in Forms(html).forms)
        if proto == "https":
            assert drawn and r.status == 303 and site.catalog.get("gpt") is not None
        else:  # the proxy's hop to llmgwd is loopback: the browser's plain http:// counts
            assert not drawn and "open the console over https://" in html
            assert r.status == 403 and "add it over https://" in page
            assert CREDENTIAL not in page and site.catalog.get("gpt") is None
