"""/api/v1's people routes as a caller sees them: what is made, and each refusal's status and
the field it names."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.typedefs import Handler

from llmgwd import auth
from llmgwd.api.access import key_auth
from llmgwd.api.base import ApiContext, NodeInfo
from llmgwd.api.routes import api_subapp
from llmgwd.catalog import Catalog
from llmgwd.people.directory import Directory
from llmgwd.store.sqlite import SqliteStore


class NoNodes:
    def nodes(self) -> list[NodeInfo]:
        return []


@pytest.fixture
async def api_port() -> AsyncIterator[tuple[str, str, Directory]]:
    """The API behind key_auth (an admin key: staff admin), and an acting user's principal
    for requests that send X-Test-User (a user with no staff role)."""
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()

    @web.middleware
    async def as_user(request: web.Request, handler: Handler) -> web.StreamResponse:
        user = request.headers.get("X-Test-User")
        if user:
            request[auth.PRINCIPAL] = auth.Principal(f"user {user}", user=user)
        return await handler(request)

    ctx = ApiContext(catalog=catalog, nodes=NoNodes(), mint_token=lambda: "t", join_url="")
    app = web.Application()
    sub = api_subapp(ctx, key_auth(catalog))
    sub.middlewares.append(as_user)
    app.add_subapp("/api/v1", sub)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    _, admin = await catalog.create_key("a", "admin")
    yield str(server.make_url("/api/v1")), admin, Directory(store)
    await server.close()
    await store.close()


async def _call(
    port: tuple[str, str, Directory], method: str, path: str, body: object = None, user: str = ""
) -> tuple[int, Any]:
    base, key, _ = port
    headers = {"Authorization": f"Bearer {key}"} | ({"X-Test-User": user} if user else {})
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, base + path, headers=headers, json=body) as r,
    ):
        return r.status, await r.json()


async def test_an_admin_key_builds_an_organization(
    api_port: tuple[str, str, Directory],
) -> None:
    assert (await _call(api_port, "POST", "/orgs", {"name": "acme", "title": "ACME"}))[0] == 201
    assert (await _call(api_port, "POST", "/orgs/acme/teams", {"name": "ml"}))[0] == 201
    status, project = await _call(api_port, "POST", "/orgs/acme/projects",
                                  {"name": "chat", "team": "ml"})  # fmt: skip
    assert status == 201 and project["team"] == "ml"
    status, user = await _call(api_port, "POST", "/users", {"name": "ann", "email": "a@acme.org"})
    assert status == 201 and user["source"] == "staff" and user["active"]
    status, m = await _call(api_port, "PUT", "/orgs/acme/teams/ml/members/ann", {"role": "manager"})
    assert status == 200 and m["role"] == "manager" and m["set_by"] == "hand"
    _, members = await _call(api_port, "GET", "/orgs/acme/members")
    assert [(x["scope"]["name"], x["role"]) for x in members] == [("ml", "manager")]


async def test_refusals_name_what_is_wrong(api_port: tuple[str, str, Directory]) -> None:
    await _call(api_port, "POST", "/orgs", {"name": "acme"})
    status, err = await _call(api_port, "POST", "/orgs", {"name": "acme"})
    assert status == 409 and err["error"]["code"] == "conflict"
    status, err = await _call(api_port, "POST", "/orgs", {"name": "Bad Name"})
    assert status == 400 and err["error"]["param"] == "name"
    status, err = await _call(api_port, "POST", "/orgs/acme/projects", {"name": "p", "team": "x"})
    assert status == 404 and "acme/x" in err["error"]["message"]
    await _call(api_port, "POST", "/users", {"name": "ann"})
    status, err = await _call(api_port, "PUT", "/orgs/acme/members/ann", {"role": "owner"})
    assert status == 400 and err["error"]["param"] == "role"
    status, _ = await _call(api_port, "PUT", "/orgs/acme/members/nobody", {"role": "member"})
    assert status == 404


async def test_an_org_admin_cannot_take_their_own_admin_role_away(
    api_port: tuple[str, str, Directory],
) -> None:
    await _call(api_port, "POST", "/orgs", {"name": "acme"})
    _, ann = await _call(api_port, "POST", "/users", {"name": "ann"})
    await _call(api_port, "PUT", "/orgs/acme/members/ann", {"role": "admin"})
    status, err = await _call(
        api_port, "PUT", "/orgs/acme/members/ann", {"role": "member"}, user=ann["id"]
    )
    assert status == 403 and "own admin role" in err["error"]["message"]
    status, _ = await _call(api_port, "DELETE", "/orgs/acme/members/ann", user=ann["id"])
    assert status == 403
    assert await api_port[2].role_in(ann["id"], "acme") == "admin"


async def test_a_user_changed_twice_keeps_both_changes(
    api_port: tuple[str, str, Directory],
) -> None:
    await _call(api_port, "POST", "/users", {"name": "ann"})
    await _call(api_port, "PATCH", "/users/ann", {"email": "ann@acme.org"})
    status, user = await _call(api_port, "PATCH", "/users/ann", {"active": False})
    assert status == 200 and user["email"] == "ann@acme.org" and not user["active"]
    status, staff = await _call(api_port, "PUT", "/users/ann/staff", {"role": "viewer"})
    assert status == 200 and staff["staff"] == "viewer"


async def test_staff_give_a_user_the_external_id_their_sign_in_links_by(
    api_port: tuple[str, str, Directory],
) -> None:
    body = {"name": "bea", "external_id": "00u1bea"}
    status, bea = await _call(api_port, "POST", "/users", body)
    assert status == 201 and bea["external_id"] == "00u1bea"
    status, bea = await _call(api_port, "PATCH", "/users/bea", {"external_id": "00u2bea"})
    assert status == 200 and bea["external_id"] == "00u2bea"
    assert (await api_port[2].user("bea")) is not None
    for bad in (" 00u2", "x" * 257, "a\nb"):
        status, err = await _call(api_port, "PATCH", "/users/bea", {"external_id": bad})
        assert status == 400 and err["error"]["param"] == "external_id", err
    assert (await _call(api_port, "GET", "/users/bea"))[1]["external_id"] == "00u2bea"


async def test_a_team_manager_gives_no_role_above_their_own(
    api_port: tuple[str, str, Directory],
) -> None:
    await _call(api_port, "POST", "/orgs", {"name": "acme"})
    await _call(api_port, "POST", "/orgs/acme/teams", {"name": "ml"})
    _, ann = await _call(api_port, "POST", "/users", {"name": "ann"})
    await _call(api_port, "POST", "/users", {"name": "bob"})
    await _call(api_port, "PUT", "/orgs/acme/teams/ml/members/ann", {"role": "manager"})
    for who in ("ann", "bob"):
        status, err = await _call(api_port, "PUT", f"/orgs/acme/teams/ml/members/{who}",
                                  {"role": "admin"}, user=ann["id"])  # fmt: skip
        assert status == 403 and err["error"]["code"] == "role_above_own"
    status, _ = await _call(api_port, "PUT", "/orgs/acme/teams/ml/members/bob",
                            {"role": "manager"}, user=ann["id"])  # fmt: skip
    assert status == 200
