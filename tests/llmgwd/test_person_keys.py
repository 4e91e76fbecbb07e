"""People's keys on the client port's /api/v1, as their makers use them: a member's key in a
project, a manager's service key, a staff user's key, each with its maker's rights narrowed to
its project; keys of no maker as before; a deactivated user's keys refused at once, here and
on another control plane following the same store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd.api.access import key_auth
from llmgwd.api.base import ApiContext, NodeInfo
from llmgwd.api.routes import api_subapp
from llmgwd.catalog import Catalog, KeyOwner
from llmgwd.people.directory import Directory
from llmgwd.people.records import Scope
from llmgwd.store.sqlite import SqliteStore


class NoNodes:
    def nodes(self) -> list[NodeInfo]:
        return []


class Site:
    """The API on a TCP port, its store, catalog and directory, and people's ids and keys."""

    def __init__(self, base: str, store: SqliteStore, catalog: Catalog) -> None:
        self.base, self.store, self.catalog = base, store, catalog
        self.people = Directory(store)
        self.ids: dict[str, str] = {}
        self.keys: dict[str, str] = {}

    async def call(self, key: str, method: str, path: str, body: object = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {key}"}
        async with (
            aiohttp.ClientSession() as s,
            s.request(method, self.base + path, headers=headers, json=body) as r,
        ):
            return r.status, await r.json()


async def _fill(site: Site) -> None:
    """acme (projects chat and other), globex (project x); ann a member of acme, bob a manager
    of chat, sam a staff viewer; a first key each (as sign-in would give them)."""
    d = site.people
    for org, project in (("acme", "chat"), ("acme", "other"), ("globex", "x")):
        if await d.org(org) is None:
            await d.create_org(org)
        await d.create_project(org, project)
    for name in ("ann", "bob", "sam"):
        user = await d.create_user(name)
        site.catalog.note_user(user)
        site.ids[name] = user.id
    await d.set_member("", site.ids["ann"], Scope(org="acme"), "member")
    await d.set_member(
        "", site.ids["bob"], Scope(org="acme", kind="project", name="chat"), "manager"
    )
    await d.set_staff(site.ids["sam"], "viewer")
    for name, owner in (
        ("ann", KeyOwner(user=site.ids["ann"], org="acme", project="chat")),
        ("bob", KeyOwner(user=site.ids["bob"], org="acme", project="chat")),
        ("sam", KeyOwner(user=site.ids["sam"])),
    ):
        site.keys[name] = (await site.catalog.create_key(name, owner=owner))[1]
    site.keys["admin"] = (await site.catalog.create_key("ops", "admin"))[1]
    site.keys["old"] = (await site.catalog.create_key("old"))[1]  # a user key of no maker


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    ctx = ApiContext(catalog=catalog, nodes=NoNodes(), mint_token=lambda: "t", join_url="")
    app = web.Application()
    app.add_subapp("/api/v1", api_subapp(ctx, key_auth(catalog)))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    s = Site(str(server.make_url("/api/v1")), store, catalog)
    await _fill(s)
    yield s
    await server.close()
    await store.close()


async def test_a_member_s_project_key_reaches_its_org_s_reads_and_its_own_project(
    site: Site,
) -> None:
    ann = site.keys["ann"]
    assert (await site.call(ann, "GET", "/orgs/acme"))[0] == 200
    assert (await site.call(ann, "GET", "/orgs/acme/projects"))[0] == 200
    status, made = await site.call(ann, "POST", "/orgs/acme/projects/chat/keys", {"name": "ci"})
    assert status == 201 and made["key"].startswith("sk-llmgw-")
    assert (made["user"], made["project"], made["service"]) == (site.ids["ann"], "chat", False)
    assert (await site.call(made["key"], "GET", "/orgs/acme"))[0] == 200  # the new key works
    status, mine = await site.call(ann, "GET", "/me/keys")
    assert status == 200 and sorted(k["name"] for k in mine) == ["ann", "ci"]
    assert all(k["key"] == "" for k in mine)


async def test_a_person_s_key_name_is_any_printable_name_but_a_key_id(site: Site) -> None:
    ann, path = site.keys["ann"], "/orgs/acme/projects/chat/keys"
    status, made = await site.call(ann, "POST", path, {"name": "My laptop"})
    assert status == 201 and made["name"] == "My laptop"
    for bad in ("0123456789ab", "a\u0001b", " ", "x" * 65):
        status, body = await site.call(ann, "POST", path, {"name": bad})
        assert status == 400 and body["error"]["param"] == "name", bad
        assert "printable" in body["error"]["message"] and "regex" not in body["error"]["message"]


async def test_an_org_admin_s_project_key_acts_only_in_its_project(site: Site) -> None:
    await site.people.set_member("", site.ids["ann"], Scope(org="acme"), "admin")
    ann = site.keys["ann"]  # narrowed to acme/chat
    assert (await site.call(ann, "GET", "/orgs/acme/members"))[0] == 200
    assert (await site.call(ann, "POST", "/orgs/acme/teams", {"name": "t"}))[0] == 403
    assert (await site.call(ann, "DELETE", "/orgs/acme/projects/other"))[0] == 403
    assert (await site.call(ann, "GET", "/orgs/acme/projects/other/keys"))[0] == 403
    assert (await site.call(ann, "GET", "/orgs/acme/projects/chat/keys"))[0] == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/orgs/globex"),  # another organization
        ("POST", "/orgs/globex/projects/x/keys"),
        ("POST", "/orgs/acme/projects/other/keys"),  # ann is acme's member, her key is chat's
        ("POST", "/orgs/acme/projects/chat/service-keys"),  # a member, not a manager
        ("GET", "/orgs/acme/projects/chat/keys"),
        ("GET", "/users"),  # staff's
        ("GET", "/keys"),
        ("POST", "/me/keys"),  # a staff key: ann is no staff
    ],
)
async def test_a_member_s_key_is_refused_beyond_its_maker_s_rights(
    site: Site, method: str, path: str
) -> None:
    status, body = await site.call(site.keys["ann"], method, path, {"name": "n"})
    assert status == 403
    assert body["error"]["code"] == "not_allowed"
    assert site.keys["ann"] not in str(body)


async def test_a_manager_makes_service_keys_and_revokes_the_project_s_keys(site: Site) -> None:
    bob = site.keys["bob"]
    status, svc = await site.call(
        bob, "POST", "/orgs/acme/projects/chat/service-keys", {"name": "bot"}
    )
    assert status == 201 and svc["service"] and svc["user"] == site.ids["bob"]
    status, listed = await site.call(bob, "GET", "/orgs/acme/projects/chat/keys")
    assert status == 200 and sorted(k["name"] for k in listed) == ["ann", "bob", "bot"]
    assert (await site.call(bob, "GET", "/orgs/acme"))[0] == 403  # a project's manager only
    assert (await site.call(bob, "POST", "/orgs/acme/projects/other/keys", {"name": "n"}))[0] == 403
    ann_id = next(k["id"] for k in listed if k["name"] == "ann")
    status, gone = await site.call(bob, "DELETE", f"/orgs/acme/projects/chat/keys/{ann_id}")
    assert status == 200 and gone["revoked"]
    assert (await site.call(site.keys["ann"], "GET", "/orgs/acme"))[0] == 401


async def test_a_staff_key_has_its_maker_s_staff_role_while_they_hold_it(site: Site) -> None:
    sam = site.keys["sam"]
    assert (await site.call(sam, "GET", "/users"))[0] == 200
    assert (await site.call(sam, "POST", "/users", {"name": "eve"}))[0] == 403  # a viewer
    status, made = await site.call(sam, "POST", "/me/keys", {"name": "laptop"})
    assert status == 201 and made["project"] == ""
    await site.people.set_staff(site.ids["sam"], None)
    assert (await site.call(sam, "GET", "/users"))[0] == 403
    assert (await site.call(made["key"], "GET", "/users"))[0] == 403


async def test_a_person_s_key_revokes_itself_and_no_other(site: Site) -> None:
    ann, sam = site.keys["ann"], site.keys["sam"]
    status, body = await site.call(site.keys["admin"], "DELETE", "/me/key")
    assert status == 400 and body["error"]["code"] == "not_a_person_key"
    status, body = await site.call(ann, "DELETE", "/me/key")  # `llmgw logout`
    assert (status, body["name"], body["revoked"]) == (200, "ann", True)
    assert (await site.call(ann, "GET", "/me/keys"))[0] == 401  # that key no longer works
    assert (await site.call(sam, "GET", "/users"))[0] == 200  # and no one else's went with it


async def test_keys_of_no_maker_keep_working_as_before(site: Site) -> None:
    old, admin = site.keys["old"], site.keys["admin"]
    assert (await site.call(old, "GET", "/me/keys"))[0] == 403
    assert (await site.call(old, "GET", "/status"))[0] == 403
    assert (await site.call(admin, "GET", "/users"))[0] == 200
    status, body = await site.call(admin, "POST", "/orgs/acme/projects/chat/keys", {"name": "n"})
    assert status == 400 and body["error"]["code"] == "no_user"


async def test_a_deactivated_user_s_keys_stop_at_once_here_and_on_another_plane(
    site: Site,
) -> None:
    other = Catalog(site.store)  # another control plane's catalog, following the store
    revision = await other.load()
    changed = asyncio.Event()
    other.on_change(changed.set)
    follower = asyncio.create_task(other.follow(revision))
    try:
        assert other.authenticate(site.keys["ann"]) is not None
        status, _ = await site.call(
            site.keys["admin"], "PATCH", f"/users/{site.ids['ann']}", {"active": False}
        )
        assert status == 200
        assert (await site.call(site.keys["ann"], "GET", "/orgs/acme"))[0] == 401
        assert site.catalog.authenticate(site.keys["ann"]) is None
        while other.authenticate(site.keys["ann"]) is not None:
            await changed.wait()
            changed.clear()
        assert other.authenticate(site.keys["bob"]) is not None  # others' keys go on
        await site.call(site.keys["admin"], "PATCH", f"/users/{site.ids['ann']}", {"active": True})
        assert (await site.call(site.keys["ann"], "GET", "/orgs/acme"))[0] == 200
    finally:
        follower.cancel()


async def test_a_deleted_user_s_keys_stop_at_once_and_nothing_of_theirs_stays(
    site: Site,
) -> None:
    other = Catalog(site.store)  # another control plane's catalog, following the store
    follower = asyncio.create_task(other.follow(await other.load()))
    changed = asyncio.Event()
    other.on_change(changed.set)
    admin, ann = site.keys["admin"], site.ids["ann"]
    try:
        assert (await site.call(admin, "PATCH", f"/users/{ann}/limits", {"rpm": 5}))[0] == 200
        for who in ("sam", "bob", "ann"):  # a staff viewer, a manager, the user: refused
            assert (await site.call(site.keys[who], "DELETE", "/users/ann"))[0] == 403
        status, answer = await site.call(admin, "DELETE", "/users/ann")
        assert (status, answer) == (200, {"user": ann, "deleted": True})
        assert (await site.call(site.keys["ann"], "GET", "/orgs/acme"))[0] == 401  # at once
        while other.authenticate(site.keys["ann"]) is not None:
            await changed.wait()
            changed.clear()
        mine = [k for k in site.catalog.keys() if k.user == ann]  # noqa: SIM118 (a Catalog)
        assert mine and all(k.revoked for k in mine)
        assert (await site.call(admin, "GET", "/users/ann"))[0] == 404
        assert (await site.call(admin, "DELETE", "/users/ann"))[0] == 404
        _, members = await site.call(admin, "GET", "/orgs/acme/members")
        assert ann not in {m["user"] for m in members}
        assert (await site.call(admin, "DELETE", "/users/sam"))[0] == 200  # a staff viewer
        status, again = await site.call(admin, "POST", "/users", {"name": "ann"})  # name free
        assert status == 201 and again["id"] != ann
        sam = await site.people.create_user("sam")
        assert await site.people.staff_role(sam.id) is None  # the old sam's role is gone
        assert (await site.store.get(f"/limits/user:{ann}")) is None
    finally:
        follower.cancel()


async def test_a_member_lists_only_their_organizations_and_staff_every_one(site: Site) -> None:
    await site.people.create_org("initech")
    gil = await site.people.create_user("gil")  # of globex's project x, and of no other
    site.catalog.note_user(gil)
    await site.people.set_member(
        "", gil.id, Scope(org="globex", kind="project", name="x"), "member"
    )
    gil_key = (await site.catalog.create_key("gil", owner=KeyOwner(user=gil.id)))[1]
    await site.people.set_member("", site.ids["ann"], Scope(org="initech"), "admin")

    async def names(key: str) -> list[str]:
        status, orgs = await site.call(key, "GET", "/orgs")
        assert status == 200
        return [o["name"] for o in orgs]

    assert await names(gil_key) == ["globex"]
    assert await names(site.keys["bob"]) == ["acme"]  # a project's manager
    assert await names(site.keys["ann"]) == ["acme"]  # her key is narrowed to acme/chat
    own = (await site.catalog.create_key("ann-own", owner=KeyOwner(user=site.ids["ann"])))[1]
    assert await names(own) == ["acme", "initech"]  # her own rights: both, never globex
    everyone = ["acme", "globex", "initech"]
    assert await names(site.keys["sam"]) == everyone  # a staff viewer
    assert await names(site.keys["admin"]) == everyone
    assert (await site.call(site.keys["old"], "GET", "/orgs"))[0] == 403  # a key of no maker
