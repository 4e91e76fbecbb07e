"""`llmgw login` against npm's oidc-provider (panva's, under Node on loopback), which, unlike
oidc-provider-mock, checks PKCE and has the device authorization grant: the browser sign-in
works and a wrong code_verifier is refused by the provider; `llmgw login --device` signs in
with a user code the test confirms on the provider's pages, honours slow_down, and says
clearly when the code is refused or expires; groups become memberships; nothing secret is
logged."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import msgspec
import pytest
from click.testing import CliRunner, Result

from llmgw.api_types import DeviceAuthorization, OidcInfo
from llmgw.cli import login as cli_login
from llmgw.cli import login_device as cli_device
from llmgw.cli.login_flow import Catcher, Request
from llmgw.cli.main import main as cli
from llmgw.config import Oidc
from llmgwd.catalog import Catalog
from llmgwd.people.oidc import Provider, SignInError
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.people import npm_oidc
from tests.llmgwd.people.test_oidc_login import RULES, Gateway, serving_login
from tests.llmgwd.people.test_oidc_login import _provider as mock_provider
from tests.llmgwd.people.test_oidc_login import _provider_token as mock_token
from tests.llmgwd.people.test_oidc_login import _put_user as mock_put_user

SECRET = "llmgw-npm-client-secret-91c2"  # the provider checks it; it must never be logged


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "client-secret"
    path.write_text(SECRET + "\n")
    return path


@pytest.fixture
def issuer(secret_file: Path) -> Iterator[str]:
    with npm_oidc.running(secret_file) as url:
        npm_oidc.put_account(
            url, "ada-sub", {"email": "ada@physics.example", "groups": ["physics-all"]}
        )
        npm_oidc.put_account(
            url, "cy-sub", {"preferred_username": "cy", "groups": ["physics-staff"]}
        )
        yield url


async def _gateway(issuer: str, secret_file: Path) -> AsyncIterator[Gateway]:
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    settings = Oidc(
        issuer=issuer,
        client_id="llmgw",
        client_secret_file=str(secret_file),
        allowed_groups=("physics-all", "physics-staff"),
        rules=RULES,
    )
    async with serving_login(catalog, settings) as gw:
        yield gw
    await store.close()


@pytest.fixture
async def gw(issuer: str, secret_file: Path) -> AsyncIterator[Gateway]:
    async for g in _gateway(issuer, secret_file):
        yield g


def _in_thread(work: Callable[[], object]) -> None:
    threading.Thread(target=work, daemon=True).start()


async def _llmgw_login(gw: Gateway, home: Path, mp: pytest.MonkeyPatch, *args: str) -> Result:
    mp.setenv("XDG_CONFIG_HOME", str(home))
    runner = CliRunner()
    return await asyncio.to_thread(runner.invoke, cli, ["login", "--server", gw.base, *args])


def _session(home: Path) -> dict[str, object]:
    return dict(json.loads((home / "llmgw" / "session.json").read_text()))


async def test_browser_sign_in_with_pkce_gives_memberships(
    gw: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    person = npm_oidc.Person()
    opened: list[str] = []

    def browser(url: str) -> None:
        opened.append(url)
        _in_thread(lambda: person.sign_in(url, "ada-sub"))

    monkeypatch.setattr(cli_login, "open_browser", browser)
    result = await _llmgw_login(gw, tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "signed in as ada until" in result.output
    user = await gw.people.user("ada")
    assert user is not None and user.source == "oidc"
    [m] = await gw.people.members("physics")
    assert (m.user, m.role, m.set_by) == (user.id, "member", "group")
    assert "code_challenge_method=S256" in opened[0]
    for secret in (SECRET, str(_session(tmp_path)["key"])):
        assert secret not in caplog.text


def _code(issuer: str, info: OidcInfo) -> tuple[Request, str]:
    """A real sign-in at the provider, up to the code its redirect brings back."""
    catcher = Catcher()
    req = Request(info=info, redirect_uri=catcher.redirect_uri)
    _in_thread(lambda: npm_oidc.Person().sign_in(req.url(), "ada-sub"))
    query = catcher.wait(60)
    assert query is not None and "code" in query, query
    return req, query["code"]


async def test_the_provider_refuses_a_wrong_code_verifier(gw: Gateway, issuer: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.base}/api/v1/login/oidc") as resp:
            info = msgspec.convert(await resp.json(), OidcInfo)
        req, code = await asyncio.to_thread(_code, issuer, info)
        body = {
            "nonce": req.nonce,
            "code": code,
            "code_verifier": "W" * 64,  # not the one whose challenge the provider holds
            "redirect_uri": req.redirect_uri,
        }
        async with http.post(f"{gw.base}/api/v1/login/oidc", json=body) as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["code"] == "code_refused"
        assert await gw.people.users() == []
        # the same code with its own verifier: the verifier alone was refused
        body["code_verifier"] = req.verifier
        async with http.post(f"{gw.base}/api/v1/login/oidc", json=body) as resp:
            assert resp.status == 200, await resp.text()
    assert [u.name for u in await gw.people.users()] == ["ada"]


def _show_and(
    act: Callable[[DeviceAuthorization], object],
) -> Callable[[DeviceAuthorization], None]:
    """llmgw login's show_code, and the person acting on what it shows (in a thread)."""
    shown = cli_device.show_code

    def show(auth: DeviceAuthorization) -> None:
        shown(auth)
        _in_thread(lambda: act(auth))

    return show


async def test_device_sign_in_end_to_end(
    gw: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[DeviceAuthorization] = []

    def confirm(auth: DeviceAuthorization) -> None:
        seen.append(auth)
        npm_oidc.Person().confirm_code(auth.verification_uri, auth.user_code, "cy-sub")

    monkeypatch.setattr(cli_device, "show_code", _show_and(confirm))
    result = await _llmgw_login(gw, tmp_path, monkeypatch, "--device")
    assert result.exit_code == 0, result.output
    [auth] = seen
    assert f"enter the code\n\n  {auth.user_code}" in result.output
    assert "signed in as cy until" in result.output
    cy = await gw.people.user("cy")
    assert cy is not None and cy.source == "oidc"
    [m] = await gw.people.members("physics")
    assert (m.user, m.role, m.set_by, m.group) == (cy.id, "manager", "group", "physics-staff")
    key = str(_session(tmp_path)["key"])
    assert gw.catalog.authenticate(key) is not None
    for secret in (SECRET, key, auth.device_code, auth.user_code):
        assert secret not in caplog.text


async def test_polling_too_fast_is_slowed_down(gw: Gateway) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.base}/api/v1/login/device", json={"nonce": "n"}) as resp:
            auth = await resp.json()
        assert auth["interval"] == 1  # the provider's
        poll = {"device_code": auth["device_code"], "nonce": "n", "interval": 1}
        answers = []
        for _ in range(2):  # the second at once, sooner than the interval
            async with http.post(f"{gw.base}/api/v1/login/device/token", json=poll) as resp:
                answers.append((resp.status, await resp.json()))
    assert answers == [
        (202, {"status": "authorization_pending", "interval": 1}),
        (202, {"status": "slow_down", "interval": 6}),  # RFC 8628: 5 s more
    ]


async def test_a_device_code_refused_on_the_provider_s_page(
    gw: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(auth: DeviceAuthorization) -> None:
        npm_oidc.Person().refuse_code(auth.verification_uri, auth.user_code)

    monkeypatch.setattr(cli_device, "show_code", _show_and(refuse))
    result = await _llmgw_login(gw, tmp_path, monkeypatch, "--device")
    assert result.exit_code == 1
    assert "Error: the sign-in was refused at the provider" in result.output
    assert await gw.people.users() == []
    assert not (tmp_path / "llmgw" / "session.json").exists()


async def test_a_device_code_nobody_confirms_expires(
    tmp_path: Path, secret_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with npm_oidc.running(secret_file, device_ttl_s=2) as issuer:
        async for gw in _gateway(issuer, secret_file):
            result = await _llmgw_login(gw, tmp_path, monkeypatch, "--device")
            assert result.exit_code == 1
            assert "Error: the sign-in's user code expired before it was confirmed" in result.output
            assert not (tmp_path / "llmgw" / "session.json").exists()


async def test_llmgw_login_waits_longer_after_a_slow_down(
    gw: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []
    slowed = threading.Event()

    def pause(seconds: float) -> None:  # the first two polls at once: the second too soon
        waits.append(seconds)
        if seconds > 1:
            slowed.set()
        if len(waits) > 2:
            time.sleep(1.1)  # past the provider's interval, not the 6 s asked

    def confirm(auth: DeviceAuthorization) -> None:
        slowed.wait(60)
        npm_oidc.Person().confirm_code(auth.verification_uri, auth.user_code, "ada-sub")

    monkeypatch.setattr(cli_device, "pause", pause)
    monkeypatch.setattr(cli_device, "show_code", _show_and(confirm))
    result = await _llmgw_login(gw, tmp_path, monkeypatch, "--device")
    assert result.exit_code == 0, result.output
    assert waits[:3] == [1, 1, 6] and set(waits[3:]) <= {6}


async def test_a_device_token_s_nonce_if_any_must_be_its_own(tmp_path: Path) -> None:
    """This provider puts no nonce in a device grant's ID token (RFC 8628 has none), so the
    check is shown on oidc-provider-mock's tokens, which carry the one asked for."""
    for issuer in mock_provider():
        mock_put_user(issuer, "dee-sub", {"preferred_username": "dee"})
        token = await mock_token(issuer, "llmgw", "dee-sub", "n1")
        provider = Provider(Oidc(issuer=issuer, client_id="llmgw"))
        assert (await provider.verify(token, "n1", nonce_needed=False))["sub"] == "dee-sub"
        with pytest.raises(SignInError) as refused:
            await provider.verify(token, "another", nonce_needed=False)
        assert refused.value.code == "invalid_id_token"
