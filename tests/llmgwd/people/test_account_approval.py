"""Accounts approved by staff (oidc.approval_required): a person's first `llmgw login` against
a real OpenID Connect provider (oidc-provider-mock) makes their account, waiting, with no key
and no membership; staff approve it through /api/v1 (`llmgw user approve`), and the next sign-in
gives them their session key."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from llmgw.config import Oidc
from llmgwd.catalog import Catalog
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.people.test_oidc_login import (  # noqa: F401 (issuer: the fixture)
    RULES,
    Gateway,
    NoNodes,
    _llmgw_login,
    _put_user,
    issuer,
    serving_login,
)


@pytest.fixture
async def gw(issuer: str, tmp_path: Path) -> AsyncIterator[Gateway]:  # noqa: F811
    secret_file = tmp_path / "client-secret"
    secret_file.write_text("llmgw-client-secret\n")  # the provider takes any
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    settings = Oidc(issuer=issuer, client_id="llmgw", client_secret_file=str(secret_file),
                    scopes=("openid", "email", "profile"), rules=RULES,
                    approval_required=True)  # fmt: skip
    async with serving_login(catalog, settings) as gw:
        yield gw
    await store.close()


async def _call(gw: Gateway, method: str, path: str, key: str) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, gw.base + "/api/v1" + path, headers=headers) as r,
    ):
        return r.status, await r.json()


async def test_a_new_account_waits_without_keys_until_staff_approve_it(
    issuer: str,  # noqa: F811
    gw: Gateway,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _put_user(issuer, "ada-sub", {"preferred_username": "ada", "groups": ["physics-all"]})

    result = await _llmgw_login(gw, "ada-sub", tmp_path, monkeypatch)

    assert result.exit_code == 1
    assert "your account ada waits for staff's approval" in result.output
    assert not (tmp_path / "llmgw" / "session.json").exists()
    ada = await gw.people.user("ada")
    assert ada is not None and ada.approved is False
    assert [k for k in gw.catalog.keys() if k.user == ada.id] == []  # noqa: SIM118
    assert await gw.people.members("physics") == []
    # Signing in again changes nothing while it waits.
    assert (await _llmgw_login(gw, "ada-sub", tmp_path, monkeypatch)).exit_code == 1

    _, admin = await gw.catalog.create_key("staff", "admin")
    _, user_key = await gw.catalog.create_key("someone", "user")
    assert (await _call(gw, "POST", "/users/ada/approve", user_key))[0] == 403
    status, shown = await _call(gw, "GET", "/users/ada", admin)
    assert status == 200 and shown["approved"] is False
    status, shown = await _call(gw, "POST", "/users/ada/approve", admin)
    assert status == 200 and shown["approved"] is True

    result = await _llmgw_login(gw, "ada-sub", tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "signed in as ada until" in result.output
    key = json.loads((tmp_path / "llmgw" / "session.json").read_text())["key"]
    assert (await _call(gw, "GET", "/orgs/physics", key))[0] == 200
    assert [m.role for m in await gw.people.members("physics")] == ["member"]
