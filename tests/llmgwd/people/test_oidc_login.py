"""`llmgw login` against a real OpenID Connect provider nobody here wrote (PyPI's
oidc-provider-mock, on loopback) and llmgwd's sign-in routes in process: the test plays the
person on the provider's authorization form; groups become memberships, a role set by hand
survives sign-in, a person outside the allowed groups is refused, and a bad, foreign,
expired or replayed ID token is refused with the one error body and never logged."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import threading
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import aiohttp
import oidc_provider_mock  # type: ignore[import-untyped]
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner, Result

from llmgw.cli import login as cli_login
from llmgw.cli.main import main as cli
from llmgw.config import GroupRule, Oidc
from llmgwd.api import login
from llmgwd.api.access import key_auth
from llmgwd.api.base import ApiContext, NodeInfo
from llmgwd.api.routes import api_subapp
from llmgwd.catalog import Catalog, KeyOwner
from llmgwd.people.directory import Directory
from llmgwd.people.records import Scope, User
from llmgwd.store.sqlite import SqliteStore

RULES = (
    GroupRule(group="physics-all", org="physics", role="member"),
    GroupRule(group="physics-staff", org="physics", role="manager"),
)


class NoNodes:
    def nodes(self) -> list[NodeInfo]:
        return []


def _provider(max_age: timedelta = timedelta(hours=1)) -> Iterator[str]:
    with oidc_provider_mock.run_server_in_thread(access_token_max_age=max_age) as server:
        yield f"http://localhost:{server.server_port}"


@pytest.fixture
def issuer() -> Iterator[str]:
    yield from _provider()


def _put_user(issuer: str, sub: str, claims: dict[str, object]) -> None:
    req = urllib.request.Request(
        f"{issuer}/users/{urllib.parse.quote(sub)}",
        data=json.dumps(claims).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 204


class Gateway:
    """llmgwd's client port in process: the sign-in routes mounted before /api/v1, as the
    daemon mounts them."""

    def __init__(self, base: str, catalog: Catalog) -> None:
        self.base = base
        self.catalog = catalog
        self.people = Directory(catalog.store)


SECRET = "llmgw-client-secret-7f3a"  # the provider takes any; it must never be logged


async def _gateway(issuer: str, tmp: Path) -> AsyncIterator[Gateway]:
    secret_file = tmp / "client-secret"
    secret_file.write_text(SECRET + "\n")
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    settings = Oidc(
        issuer=issuer,
        client_id="llmgw",
        client_secret_file=str(secret_file),
        scopes=("openid", "email", "profile"),
        allowed_groups=("physics-all", "physics-staff"),
        rules=RULES,
    )
    async with serving_login(catalog, settings) as gw:
        yield gw
    await store.close()


@asynccontextmanager
async def serving_login(
    catalog: Catalog, settings: Oidc, after: Callable[[User], Awaitable[None]] | None = None
) -> AsyncIterator[Gateway]:
    """/api/v1/login (settings; after: what runs at each sign-in) and /api/v1 over catalog,
    with organization physics made."""
    ctx = ApiContext(catalog=catalog, nodes=NoNodes(), mint_token=lambda: "t", join_url="x")
    app = web.Application()
    app.add_subapp(login.PREFIX, login.login_app(catalog, settings, after=after))
    app.add_subapp("/api/v1", api_subapp(ctx, key_auth(catalog)))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    gw = Gateway(str(server.make_url("")).rstrip("/"), catalog)
    await gw.people.create_org("physics")
    try:
        yield gw
    finally:
        await server.close()


@pytest.fixture
async def gw(issuer: str, tmp_path: Path) -> AsyncIterator[Gateway]:
    async for g in _gateway(issuer, tmp_path):
        yield g


def _person(sub: str) -> Callable[[str], None]:
    """Stand in for the browser: the person submits the provider's form as `sub`; the
    provider's redirect goes on to llmgw login's catcher on 127.0.0.1."""

    def opened(url: str) -> None:
        def submit() -> None:
            form = urllib.parse.urlencode({"sub": sub}).encode()
            with urllib.request.urlopen(urllib.request.Request(url, data=form)) as resp:
                assert resp.status == 200  # the catcher's page, after the 302

        threading.Thread(target=submit, daemon=True).start()

    return opened


async def _llmgw_login(
    gw: Gateway, sub: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> Result:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.setattr(cli_login, "open_browser", _person(sub))
    runner = CliRunner()
    return await asyncio.to_thread(runner.invoke, cli, ["login", "--server", gw.base])


async def test_login_signs_in_and_groups_become_memberships(
    issuer: str,
    gw: Gateway,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    _put_user(issuer, "ada-sub", {"email": "ada@physics.example", "groups": ["physics-all"]})
    result = await _llmgw_login(gw, "ada-sub", tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "signed in as ada until" in result.output
    saved = tmp_path / "llmgw" / "session.json"
    assert stat.S_IMODE(os.stat(saved).st_mode) == 0o600
    session = json.loads(saved.read_text())
    assert session["key"].startswith("sk-llmgw-")
    user = await gw.people.user("ada")
    assert user is not None and user.source == "oidc" and user.email == "ada@physics.example"
    [m] = await gw.people.members("physics")
    assert (m.user, m.role, m.set_by, m.group) == (user.id, "member", "group", "physics-all")
    assert SECRET not in caplog.text and session["key"] not in caplog.text


async def _get(gw: Gateway, path: str, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http, http.get(gw.base + path, headers=headers) as r:
        return r.status


async def test_the_session_key_opens_the_user_s_own_organization_only(
    issuer: str, gw: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await gw.people.create_org("chemistry")
    _put_user(issuer, "fay-sub", {"preferred_username": "fay", "groups": ["physics-all"]})
    assert (await _llmgw_login(gw, "fay-sub", tmp_path, monkeypatch)).exit_code == 0
    key = json.loads((tmp_path / "llmgw" / "session.json").read_text())["key"]
    assert await _get(gw, "/api/v1/orgs/physics/members", key) == 200
    assert await _get(gw, "/api/v1/orgs/chemistry/members", key) == 403
    assert await _get(gw, "/api/v1/users", key) == 403  # staff only


async def test_a_sign_in_s_key_stops_when_its_life_is_over(gw: Gateway) -> None:
    fay = await gw.people.create_user("fay", source="oidc")
    gw.catalog.note_user(fay)
    owner = KeyOwner(user=fay.id)
    _, ended = await gw.catalog.create_key("login fay", owner=owner, expires_at=1.0)
    _, live = await gw.catalog.create_key("login fay", owner=owner, expires_at=4e9)
    assert await _get(gw, "/api/v1/orgs/physics", ended) == 401
    assert gw.catalog.authenticate(ended) is None
    assert gw.catalog.authenticate(live) is not None


async def test_a_manager_set_by_hand_stays_manager_at_every_sign_in(
    issuer: str, gw: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put_user(issuer, "bo-sub", {"preferred_username": "bo", "groups": ["physics-all"]})
    assert (await _llmgw_login(gw, "bo-sub", tmp_path, monkeypatch)).exit_code == 0
    bo = await gw.people.user("bo")
    assert bo is not None
    await gw.people.set_member("", bo.id, Scope(org="physics"), "manager")  # by hand
    for _ in range(2):
        result = await _llmgw_login(gw, "bo-sub", tmp_path, monkeypatch)
        assert result.exit_code == 0, result.output
        [m] = await gw.people.members("physics")
        assert (m.role, m.set_by) == ("manager", "hand")
    assert len(await gw.people.users()) == 1  # the same user each time


async def test_a_group_left_takes_its_membership_away(
    issuer: str, gw: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put_user(issuer, "cy-sub", {"preferred_username": "cy", "groups": ["physics-staff"]})
    assert (await _llmgw_login(gw, "cy-sub", tmp_path, monkeypatch)).exit_code == 0
    assert [m.role for m in await gw.people.members("physics")] == ["manager"]
    _put_user(issuer, "cy-sub", {"preferred_username": "cy", "groups": ["physics-all"]})
    assert (await _llmgw_login(gw, "cy-sub", tmp_path, monkeypatch)).exit_code == 0
    assert [m.role for m in await gw.people.members("physics")] == ["member"]


async def test_a_person_outside_the_allowed_groups_is_refused(
    issuer: str, gw: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put_user(issuer, "eve-sub", {"preferred_username": "eve", "groups": ["chemistry"]})
    result = await _llmgw_login(gw, "eve-sub", tmp_path, monkeypatch)
    assert result.exit_code == 1
    assert "you are in none of the groups allowed to sign in" in result.output
    assert await gw.people.users() == []
    assert not (tmp_path / "llmgw" / "session.json").exists()


async def _provider_token(issuer: str, client_id: str, sub: str, nonce: str) -> str:
    """An ID token the provider itself issues (the authorization form, then its token
    endpoint), for any client id."""
    query = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": "http://127.0.0.1:9/cb",
        "scope": "openid email profile",
        "state": "s",
        "nonce": nonce,
    }
    async with aiohttp.ClientSession() as http:
        url = f"{issuer}/oauth2/authorize?" + urllib.parse.urlencode(query)
        async with http.post(url, data={"sub": sub}, allow_redirects=False) as resp:
            assert resp.status == 302, await resp.text()
            code = urllib.parse.parse_qs(urllib.parse.urlsplit(resp.headers["Location"]).query)
        form = {
            "grant_type": "authorization_code",
            "code": code["code"][0],
            "redirect_uri": query["redirect_uri"],
            "client_id": client_id,
            "client_secret": "any",
        }
        async with http.post(f"{issuer}/oauth2/token", data=form) as resp:
            assert resp.status == 200, await resp.text()
            return str((await resp.json())["id_token"])


async def _post_token(gw: Gateway, token: str, nonce: str) -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.base}/api/v1/login/oidc", json={"id_token": token, "nonce": nonce}) as resp,
    ):
        return resp.status, await resp.json()


REFUSED = {
    "error": {
        "message": "the provider's ID token is not valid here",
        "type": "authentication_error",
        "code": "invalid_id_token",
    }
}


async def test_a_bad_foreign_or_replayed_token_is_refused_and_never_logged(
    issuer: str, gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    _put_user(issuer, "dee-sub", {"preferred_username": "dee", "groups": ["physics-all"]})
    good = await _provider_token(issuer, "llmgw", "dee-sub", "n1")
    foreign = await _provider_token(issuer, "another-app", "dee-sub", "n2")
    head, body, sig = good.split(".")
    tampered = f"{head}.{body}.{sig[:-4]}AAAA"
    for token, nonce in [
        ("not-a-jwt", "n1"),
        (tampered, "n1"),  # the signature does not hold
        (foreign, "n2"),  # another client's audience
        (good, "other-nonce"),  # replayed into another sign-in
    ]:
        assert await _post_token(gw, token, nonce) == (401, REFUSED)
    assert await gw.people.users() == []
    status, answer = await _post_token(gw, good, "n1")
    assert status == 200 and answer["name"] == "dee"
    for secret in (good, foreign, tampered, sig, str(answer["key"])):
        assert secret not in caplog.text


async def test_an_expired_token_is_refused(tmp_path: Path) -> None:
    for issuer in _provider(max_age=timedelta(seconds=-600)):
        _put_user(issuer, "old-sub", {"preferred_username": "old", "groups": ["physics-all"]})
        token = await _provider_token(issuer, "llmgw", "old-sub", "n")
        async for gw in _gateway(issuer, tmp_path):
            assert await _post_token(gw, token, "n") == (401, REFUSED)
            assert await gw.people.users() == []
