"""Limits, budgets and model lists of organizations, teams, projects and users through /api/v1:
who may set them (an organization's admin its own, a staff admin all, a user's only staff),
what they show, and a change reaching the router's Meter through the catalog's watch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd.accounting.levels import Levels
from llmgwd.accounting.usage import Usage
from llmgwd.api.access import key_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_subapp
from llmgwd.catalog import Catalog, KeyOwner, Model
from llmgwd.people.records import Scope
from llmgwd.router import errors
from llmgwd.router.metering import Meter
from llmgwd.router.token_bounds import Estimate
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.test_person_keys import NoNodes, Site, _fill


class UsageSite(Site):
    usage: Usage


@pytest.fixture
async def site() -> AsyncIterator[tuple[UsageSite, Levels]]:
    store = await SqliteStore.open(":memory:")
    levels = Levels()
    catalog = Catalog(store, followers=(levels,))
    follow = asyncio.create_task(catalog.follow(await catalog.load()))
    ctx = ApiContext(
        catalog=catalog, nodes=NoNodes(), mint_token=lambda: "t", join_url="", usage=Usage(store)
    )
    app = web.Application()
    app.add_subapp("/api/v1", api_subapp(ctx, key_auth(catalog)))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    s = UsageSite(str(server.make_url("/api/v1")), store, catalog)
    await _fill(s)
    await s.people.create_team("acme", "ml")
    await s.people.create_project("acme", "search", team="ml")
    ada = await s.people.create_user("ada")  # acme's admin
    catalog.note_user(ada)
    await s.people.set_member("", ada.id, Scope(org="acme"), "admin")
    s.ids["ada"] = ada.id
    s.keys["ada"] = (await catalog.create_key("ada", owner=KeyOwner(user=ada.id)))[1]
    owner = KeyOwner(user=ada.id, org="acme", project="chat")
    s.keys["ada-chat"] = (await catalog.create_key("ada-chat", owner=owner))[1]
    await catalog.add_model(Model(name="small", source="file:/s.gguf"))
    await catalog.add_model(Model(name="big", source="file:/b.gguf", price_prompt=1.0))
    assert ctx.usage is not None
    s.usage = ctx.usage
    yield s, levels
    follow.cancel()
    await server.close()
    await store.close()


async def test_an_organizations_admin_sets_its_limits_and_nobody_else(
    site: tuple[UsageSite, Levels],
) -> None:
    s, _ = site
    body = {"rpm": 100, "budget_spend": 50.0, "budget_spend_per": "month", "models": ["small"]}
    for who in ("ann", "bob", "sam", "ada-chat"):  # a member, a project manager, a viewer,
        assert (await s.call(s.keys[who], "PATCH", "/orgs/acme/limits", body))[0] == 403
    # ... and the admin's own key narrowed to a project: all refused.
    status, view = await s.call(s.keys["ada"], "PATCH", "/orgs/acme/limits", body)
    assert status == 200
    assert view["level"] == "org:acme" and view["models"] == ["small"]
    assert (view["limits"]["rpm"], view["limits"]["budget_spend"]) == (100, 50.0)
    status, view = await s.call(s.keys["ada"], "PATCH", "/orgs/acme/limits", {"tpm": 9})
    assert view["limits"]["rpm"] == 100 and view["limits"]["tpm"] == 9  # the others kept
    assert view["models"] == ["small"]
    team = await s.call(s.keys["ada"], "PATCH", "/orgs/acme/limits/teams/ml", {"rpm": 5})
    project = await s.call(s.keys["ada"], "PATCH", "/orgs/acme/limits/projects/chat", {"tpm": 7})
    assert (team[0], project[0]) == (200, 200)
    assert (await s.call(s.keys["ada"], "PATCH", "/orgs/globex/limits", {"rpm": 1}))[0] == 403
    assert (await s.call(s.keys["admin"], "PATCH", "/orgs/globex/limits", {"rpm": 1}))[0] == 200
    status, views = await s.call(s.keys["ann"], "GET", "/orgs/acme/limits")
    assert status == 200  # members read them
    assert [v["level"] for v in views] == [
        "org:acme", "team:acme:ml", "project:acme:chat", "project:acme:other",
        "project:acme:search",
    ]  # fmt: skip
    assert views[1]["limits"]["rpm"] == 5 and views[2]["limits"]["tpm"] == 7


async def test_a_users_limits_are_a_staff_admins(site: tuple[UsageSite, Levels]) -> None:
    s, _ = site
    path = "/users/ann/limits"
    assert (await s.call(s.keys["ann"], "PATCH", path, {"rpm": 1000}))[0] == 403
    assert (await s.call(s.keys["ada"], "PATCH", path, {"rpm": 1000}))[0] == 403
    status, view = await s.call(s.keys["admin"], "PATCH", path, {"budget_tokens": 1000})
    assert status == 200 and view["level"] == f"user:{s.ids['ann']}"
    status, view = await s.call(s.keys["sam"], "GET", path)  # a staff viewer reads it
    assert status == 200 and view["limits"]["budget_tokens"] == 1000


async def test_wrong_limits_are_refused_and_named(site: tuple[UsageSite, Levels]) -> None:
    s, _ = site
    key = s.keys["ada"]
    for path, body, status, param in (
        ("/orgs/acme/limits", {"models": ["nope"]}, 400, "models"),
        ("/orgs/acme/limits", {"rpm": -1}, 400, "rpm"),
        ("/orgs/acme/limits", {"colour": 1}, 400, None),
        ("/orgs/acme/limits/teams/nope", {"rpm": 1}, 404, None),
        ("/orgs/acme/limits/projects/nope", {"rpm": 1}, 404, None),
    ):
        got, answer = await s.call(key, "PATCH", path, body)
        assert got == status, path
        assert set(answer) == {"error"}
        if param:
            assert answer["error"]["param"] == param


async def test_a_limit_set_through_the_api_holds_on_v1(site: tuple[UsageSite, Levels]) -> None:
    s, levels = site
    meter = Meter(levels=levels)
    keys = s.catalog.keys()
    key = next(k for k in keys if k.name == "ann")  # ann's key in acme/chat
    big, small = s.catalog.get("big"), s.catalog.get("small")
    assert big is not None and small is not None
    meter.admit(key, big, Estimate(prompt=1, completion=1)).settle()
    body = {"budget_tokens": 100, "models": ["small"]}
    assert (await s.call(s.keys["ada"], "PATCH", "/orgs/acme/limits/projects/chat", body))[0] == 200
    for _ in range(100):  # the watch brings it (sqlite: at once, give or take a task switch)
        if levels.chain(key).models is not None:
            break
        await asyncio.sleep(0.01)
    with pytest.raises(errors.ApiError) as caught:
        meter.admit(key, big, Estimate(prompt=1, completion=1))
    assert caught.value.status == 404
    with pytest.raises(errors.ApiError) as caught:
        meter.admit(key, small, Estimate(prompt=100, completion=1))
    assert caught.value.detail.code == "insufficient_quota"
    meter.admit(key, small, Estimate(prompt=90, completion=8)).settle()


async def test_usage_is_summed_by_organization_team_project_and_user(
    site: tuple[UsageSite, Levels],
) -> None:
    s, _ = site
    owner = KeyOwner(user=s.ids["ann"], org="acme", project="search")  # in team ml
    ann_search, _ = await s.catalog.create_key("ann-search", owner=owner)
    ids = {k.name: k.id for k in s.catalog.keys()}  # noqa: SIM118 (a Catalog, no dict)
    usage = s.usage
    for name, tokens in (("ann", 10), ("bob", 20), ("ann-search", 40), ("ops", 80)):
        usage.add(("2030-01-02", ids[name], "small"), tokens, 0, 0)
    admin = s.keys["admin"]
    sums = {}
    for by in ("org", "team", "project", "user"):
        status, answer = await s.call(admin, "GET", f"/usage?by={by}&since=2030-01-01")
        assert status == 200 and answer["by"] == by
        sums[by] = {row[by]: row["prompt_tokens"] for row in answer["rows"]}
        assert answer["total"]["prompt_tokens"] == 150
    assert sums["org"] == {"acme": 70, "": 80}  # "": keys of no organization
    assert sums["team"] == {"acme/ml": 40, "": 110}
    assert sums["project"] == {"acme/chat": 30, "acme/search": 40, "": 80}
    assert sums["user"] == {s.ids["ann"]: 50, s.ids["bob"]: 20, "": 80}
    assert ann_search.id in ids.values()
    assert (await s.call(s.keys["ann"], "GET", "/usage?by=org"))[0] == 403  # staff's


async def test_an_organizations_admin_reads_its_usage_and_no_other(
    site: tuple[UsageSite, Levels],
) -> None:
    s, _ = site
    ids = {k.name: k.id for k in s.catalog.keys()}  # noqa: SIM118 (a Catalog, no dict)
    for name, tokens in (("ann", 10), ("bob", 20), ("ops", 80)):
        s.usage.add(("2030-01-02", ids[name], "small"), tokens, 0, 0)
    status, answer = await s.call(s.keys["ada"], "GET", "/orgs/acme/usage?by=key&since=2030-01-01")
    assert status == 200
    assert {r["name"]: r["prompt_tokens"] for r in answer["rows"]} == {"ann": 10, "bob": 20}
    assert answer["total"]["prompt_tokens"] == 30  # the admin key's 80 is no part of acme's
    for who in ("ann", "bob"):  # a member, a project's manager
        assert (await s.call(s.keys[who], "GET", "/orgs/acme/usage"))[0] == 403
    assert (await s.call(s.keys["ada"], "GET", "/orgs/globex/usage"))[0] == 403
    assert (await s.call(s.keys["sam"], "GET", "/orgs/globex/usage"))[0] == 200  # staff reads
    assert (await s.call(s.keys["admin"], "GET", "/orgs/nope/usage"))[0] == 404


async def test_a_level_deleted_and_made_again_starts_without_its_old_limits(
    site: tuple[UsageSite, Levels],
) -> None:
    s, levels = site
    admin, body = s.keys["admin"], {"rpm": 7, "budget_tokens": 70, "models": ["small"]}
    paths = ("", "/teams/ml", "/projects/search", "/projects/chat")
    for path in paths:
        assert (await s.call(admin, "PATCH", "/orgs/acme/limits" + path, body))[0] == 200
    assert (await s.call(admin, "DELETE", "/orgs/acme/projects/chat"))[0] == 200
    assert (await s.call(admin, "POST", "/orgs/acme/projects", {"name": "chat"}))[0] == 201
    status, views = await s.call(admin, "GET", "/orgs/acme/limits")
    kept = {v["level"]: v["limits"]["rpm"] for v in views}
    assert kept == {"org:acme": 7, "team:acme:ml": 7, "project:acme:search": 7,
                    "project:acme:chat": 0, "project:acme:other": 0}  # fmt: skip
    assert (await s.call(admin, "DELETE", "/orgs/acme"))[0] == 200
    for post, name in (("", "acme"), ("/acme/teams", "ml"), ("/acme/projects", "search")):
        assert (await s.call(admin, "POST", "/orgs" + post, {"name": name}))[0] == 201
    status, views = await s.call(admin, "GET", "/orgs/acme/limits")
    assert status == 200 and len(views) == 3
    for view in views:  # the new acme, its team and project: no old limits, every model
        assert view["models"] == [] and view["limits"]["rpm"] == 0, view
        assert view["limits"]["budget_tokens"] == 0, view
    for _ in range(100):  # the Meter's index drops them too (the watch's deletes)
        if levels.record("org:acme").limits.rpm == 0:
            break
        await asyncio.sleep(0.01)
    assert levels.record("project:acme:search").models == []
