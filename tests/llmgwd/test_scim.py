"""/scim/v2 as an identity provider uses it: only the SCIM token passes, users found by
userName, deactivation (Entra's string "False" too) stopping the user's keys at once, groups
made memberships by the settings' rules without rewriting a role set by hand, and every error
in SCIM's error body."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.config import GroupRule
from llmgwd.catalog import Catalog, KeyOwner
from llmgwd.people.directory import Directory
from llmgwd.people.records import Scope
from llmgwd.scim import token
from llmgwd.scim.app import PREFIX, scim_app
from llmgwd.scim.base import ERROR, PATCH_OP, ScimContext
from llmgwd.store.sqlite import SqliteStore


class Scim:
    def __init__(self, url: str, secret: str, catalog: Catalog) -> None:
        self.url, self.secret, self.catalog = url, secret, catalog
        self.people = Directory(catalog.store)

    async def call(
        self, method: str, path: str, body: object = None, secret: str | None = None
    ) -> tuple[int, Any]:
        bearer = self.secret if secret is None else secret
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        async with (
            aiohttp.ClientSession() as s,
            s.request(method, self.url + path, headers=headers, json=body) as r,
        ):
            assert r.status == 204 or r.content_type == "application/scim+json"
            return r.status, await r.json() if r.status != 204 else None


@asynccontextmanager
async def serving() -> AsyncIterator[Scim]:
    """/scim/v2 served in-process over a fresh store, with its token made."""
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    people = Directory(store)
    await people.create_org("acme")
    await people.create_project("acme", "chat")
    rules = (
        GroupRule(group="ml-staff", org="acme", role="member"),
        GroupRule(group="ml-leads", org="acme", project="chat", role="manager"),
    )
    app = web.Application()
    app.add_subapp(PREFIX, scim_app(ScimContext(catalog, rules)))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield Scim(str(server.make_url(PREFIX)), await token.mint(store), catalog)
    finally:
        await server.close()
        await store.close()


@pytest.fixture
async def scim() -> AsyncIterator[Scim]:
    async with serving() as s:
        yield s


def _op(op: str, path: str, value: object = None) -> dict[str, object]:
    return {"schemas": [PATCH_OP], "Operations": [{"op": op, "path": path, "value": value}]}


async def test_only_the_scim_token_passes(scim: Scim) -> None:
    _, admin = await scim.catalog.create_key("ops", "admin")
    for secret in ("", admin, "scim-llmgw-wrong"):
        status, body = await scim.call("GET", "/Users", secret=secret)
        assert status == 401
        assert body["schemas"] == [ERROR] and body["status"] == "401"
        assert admin not in str(body)
    await token.mint(scim.catalog.store)  # a new token: the old one stops
    assert (await scim.call("GET", "/Users"))[0] == 401


async def test_a_user_deactivated_by_scim_has_every_key_refused_at_once(scim: Scim) -> None:
    status, ann = await scim.call("POST", "/Users", {"schemas": [], "userName": "Ann"})
    assert status == 201 and ann["active"] is True
    status, found = await scim.call("GET", '/Users?filter=userName eq "ann"')
    assert found["totalResults"] == 1 and found["Resources"][0]["id"] == ann["id"]
    owner = KeyOwner(user=ann["id"], org="acme", project="chat")
    keys = [(await scim.catalog.create_key(n, owner=owner))[1] for n in ("a", "b")]
    assert all(scim.catalog.authenticate(k) is not None for k in keys)
    status, off = await scim.call("PATCH", f"/Users/{ann['id']}", _op("Replace", "active", "False"))
    assert status == 200 and off["active"] is False
    assert all(scim.catalog.authenticate(k) is None for k in keys)
    await scim.call("PATCH", f"/Users/{ann['id']}", _op("replace", "active", True))
    assert all(scim.catalog.authenticate(k) is not None for k in keys)
    assert (await scim.call("DELETE", f"/Users/{ann['id']}"))[0] == 204
    assert all(scim.catalog.authenticate(k) is None for k in keys)
    assert (await scim.call("GET", f"/Users/{ann['id']}"))[0] == 404


async def test_groups_become_memberships_by_the_rules_and_keep_a_hand_s_role(scim: Scim) -> None:
    ids = {}
    for name in ("ann", "bob"):
        ids[name] = (await scim.call("POST", "/Users", {"userName": name}))[1]["id"]
    await scim.people.set_member("", ids["bob"], Scope(org="acme"), "admin")  # by hand
    members = [{"value": ids["ann"]}, {"value": ids["bob"]}]
    status, staff = await scim.call(
        "POST", "/Groups", {"displayName": "ml-staff", "members": members}
    )
    assert status == 201
    await scim.call("POST", "/Groups", {"displayName": "no-rule", "members": members})
    assert await scim.people.role_in(ids["ann"], "acme") == "member"
    assert await scim.people.role_in(ids["bob"], "acme") == "admin"  # a group never rewrites it
    leads = {"displayName": "ml-leads", "members": [{"value": ids["ann"]}]}
    await scim.call("POST", "/Groups", leads)
    assert await scim.people.role_in(ids["ann"], "acme", project="chat") == "manager"
    remove = _op("remove", f'members[value eq "{ids["ann"]}"]')
    status, left = await scim.call("PATCH", f"/Groups/{staff['id']}", remove)
    assert status == 200 and [m["value"] for m in left["members"]] == [ids["bob"]]
    assert await scim.people.role_in(ids["ann"], "acme") is None
    assert (await scim.call("DELETE", f"/Groups/{staff['id']}"))[0] == 204
    assert await scim.people.role_in(ids["bob"], "acme") == "admin"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "scim_type"),
    [
        ("GET", "/Users?filter=userName sw \"a\"", None, 400, "invalidFilter"),
        ("POST", "/Users", {"userName": "x y"}, 400, "invalidValue"),
        ("POST", "/Users", {"displayName": "no name"}, 400, "invalidValue"),
        ("PATCH", "/Users/000000000000", _op("replace", "active", False), 404, ""),
        ("POST", "/Groups", {"displayName": "g", "members": [{"value": "nobody"}]}, 400,
         "invalidValue"),
        ("DELETE", "/Schemas", None, 405, ""),
        ("GET", "/Nothing", None, 404, ""),
    ],
)  # fmt: skip
async def test_every_error_is_scim_s_error_body(
    scim: Scim, method: str, path: str, body: object, status: int, scim_type: str
) -> None:
    got, answer = await scim.call(method, path, body)
    assert got == status
    assert answer["schemas"] == [ERROR] and answer["status"] == str(status)
    assert answer.get("scimType", "") == scim_type


async def test_a_user_s_external_id_is_the_one_their_sign_in_links_by(scim: Scim) -> None:
    body = {"schemas": [], "userName": "bea", "externalId": "00u1bea"}
    status, bea = await scim.call("POST", "/Users", body)
    assert status == 201 and bea["externalId"] == "00u1bea"
    user = await scim.people.user(bea["id"])
    assert user is not None and user.external_id == "00u1bea" and user.source == "scim"
    await scim.call("PUT", f"/Users/{bea['id']}", {"schemas": [], "userName": "bea"})
    user = await scim.people.user(bea["id"])
    assert user is not None and user.external_id == ""  # a PUT without it takes it away
    status, err = await scim.call("PATCH", f"/Users/{bea['id']}", _op("add", "externalId", 7))
    assert status == 400 and err["scimType"] == "invalidValue"


async def test_a_user_name_taken_is_a_uniqueness_conflict(scim: Scim) -> None:
    assert (await scim.call("POST", "/Users", {"userName": "ann"}))[0] == 201
    status, body = await scim.call("POST", "/Users", {"userName": "ANN"})
    assert status == 409 and body["scimType"] == "uniqueness"
