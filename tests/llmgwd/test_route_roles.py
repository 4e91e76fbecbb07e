"""Every route of the client port's /api/v1 and /hf, taken from their route tables, checks its
role: no key is a 401, a user key is a 403 on /api/v1 and enough on /hf, an admin key passes;
and every /api/v1 route (api.routes.TABLE, the route records the API is served from) against every
role: each staff role, each membership role in the path's organization and in another one, and
nobody; each route's rule is the staff policy (viewer reads, operator changes models, nodes,
mirror and Slurm, admin everything)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.typedefs import Handler, Middleware

from llmgwd import auth
from llmgwd.api import routes
from llmgwd.api.access import key_auth
from llmgwd.api.base import ApiContext, NodeInfo
from llmgwd.api.routes import api_subapp
from llmgwd.auth import Principal
from llmgwd.catalog import Catalog
from llmgwd.metrics import endpoint
from llmgwd.mirror import hub_server, peers, setup
from llmgwd.mirror.records import Records
from llmgwd.mirror.service import Mirror, Settings
from llmgwd.people.directory import Directory
from llmgwd.people.records import MemberRole, Scope, StaffRole
from llmgwd.scim import app as scim
from llmgwd.scim import token
from llmgwd.scim.base import ScimContext
from llmgwd.store.sqlite import SqliteStore

# What each path parameter is given: a well-formed value, so the role is checked, not the path.
SAMPLES = {
    "sha256": "0" * 64,
    "org": "acme",
    "repo": "tiny",
    "revision": "main",
    "path": "config.json",
    "team": "ml",
    "project": "chat",
    "user": "zed",
    "id": "0123456789ab",
}


class NoNodes:
    def nodes(self) -> list[NodeInfo]:
        return []


def _fill(path: str) -> str:
    def one(m: re.Match[str]) -> str:
        name, _, pattern = m.group(1).partition(":")
        if pattern and "|" in pattern:
            return pattern.split("|")[0]
        return SAMPLES.get(name, "x")

    return re.sub(r"\{([^}]+)\}", one, path)


def _routes(prefix: str, table: list[web.RouteDef]) -> list[tuple[str, str]]:
    out = []
    for r in table:
        out.append((r.method, prefix + _fill(r.path)))
    return out


API_ROUTES = [(r.method, "/api/v1" + _fill(r.path)) for r in routes.TABLE]
SCIM_ROUTES = [(m, scim.PREFIX + _fill(p)) for m, p, _h, _r in scim.TABLE]
HF_ROUTES = [
    *_routes("/hf", hub_server.hub_routes()),
    ("GET", "/hf" + peers.LISTING),
]


@pytest.fixture
async def port(tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, str]]]:
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    mirror = Mirror(Settings(dir=tmp_path, upstream="http://127.0.0.1:9"), Records(store))
    await mirror.start()
    ctx = ApiContext(
        catalog=catalog,
        nodes=NoNodes(),
        mint_token=lambda: "t",
        join_url="https://cp:7710",
        mirror=mirror,
    )
    app = web.Application()
    app.add_subapp("/api/v1", api_subapp(ctx, key_auth(catalog)))
    app.add_subapp("/hf", setup.hub(mirror, catalog))
    app.add_subapp(scim.PREFIX, scim.scim_app(ScimContext(catalog)))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    _, user = await catalog.create_key("u", "user")
    _, admin = await catalog.create_key("a", "admin")
    secrets = {"user": user, "admin": admin, "scim": await token.mint(store),
               "metrics": await endpoint.TOKEN.mint(store)}  # fmt: skip
    yield str(server.make_url("")), secrets
    await server.close()
    await mirror.close()
    await store.close()


async def _status(base: str, method: str, path: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, base + path, headers=headers, json={}) as r,
    ):
        return r.status


def test_the_tables_were_read() -> None:
    assert len(API_ROUTES) >= 25 and len(HF_ROUTES) >= 5 and len(SCIM_ROUTES) >= 15


@pytest.mark.parametrize(("method", "path"), API_ROUTES + HF_ROUTES + SCIM_ROUTES)
async def test_no_key_is_refused(port: tuple[str, dict[str, str]], method: str, path: str) -> None:
    base, _ = port
    assert await _status(base, method, path, None) == 401
    assert await _status(base, method, path, "sk-llmgw-not-a-key") == 401


@pytest.mark.parametrize(("method", "path"), API_ROUTES)
async def test_api_wants_an_admin(port: tuple[str, dict[str, str]], method: str, path: str) -> None:
    base, keys = port
    assert await _status(base, method, path, keys["user"]) == 403
    assert await _status(base, method, path, keys["admin"]) not in (401, 403)


@pytest.mark.parametrize(("method", "path"), SCIM_ROUTES)
async def test_scim_takes_only_its_token(
    port: tuple[str, dict[str, str]], method: str, path: str
) -> None:
    base, secrets = port
    for role in ("user", "admin"):
        assert await _status(base, method, path, secrets[role]) == 401
    assert await _status(base, method, path, secrets["scim"]) not in (401, 403)


@pytest.mark.parametrize(("method", "path"), API_ROUTES[:3])
async def test_the_scim_token_is_no_api_key(
    port: tuple[str, dict[str, str]], method: str, path: str
) -> None:
    base, secrets = port
    assert await _status(base, method, path, secrets["scim"]) == 401


async def test_the_metrics_token_opens_no_route(port: tuple[str, dict[str, str]]) -> None:
    """The scrape token reads /metrics and nothing here: every /api/v1, /hf and SCIM route."""
    base, secrets = port
    for method, path in API_ROUTES + HF_ROUTES + SCIM_ROUTES:
        assert await _status(base, method, path, secrets["metrics"]) == 401, (method, path)


async def test_every_scim_route_is_in_its_table_with_the_token_s_rule() -> None:
    store = await SqliteStore.open(":memory:")
    sub = scim.scim_app(ScimContext(Catalog(store)))
    await store.close()
    served = {(r.method, r.resource.canonical) for r in sub.router.routes()
              if r.method != "HEAD" and r.resource is not None}  # fmt: skip
    assert served == {(m, p) for m, p, _h, _r in scim.TABLE}
    assert all(rule == scim.SCIM_TOKEN for *_, rule in scim.TABLE)


@pytest.mark.parametrize(("method", "path"), HF_ROUTES)
async def test_hf_takes_any_live_key(
    port: tuple[str, dict[str, str]], method: str, path: str
) -> None:
    base, keys = port
    for role in ("user", "admin"):
        assert await _status(base, method, path, keys[role]) not in (401, 403)


# Every route, every role.

RULED = [(r.method, "/api/v1" + _fill(r.path), r.rule) for r in routes.TABLE]
STAFF: dict[str, StaffRole] = {"staff-admin": "admin", "staff-operator": "operator",
                               "staff-viewer": "viewer"}  # fmt: skip
# Membership principals: (organization, team or "", role).
MEMBERS: dict[str, tuple[str, str, MemberRole]] = {
    "acme-admin": ("acme", "", "admin"),
    "acme-manager": ("acme", "", "manager"),
    "acme-member": ("acme", "", "member"),
    "ml-manager": ("acme", "ml", "manager"),  # of the path's team, not of the organization
    "globex-admin": ("globex", "", "admin"),  # another organization's
}
ROLES = ["nobody", *STAFF, *MEMBERS]


async def _people_principals(d: Directory) -> dict[str, Principal]:
    """The directory filled (acme with team ml and project chat, globex, user zed) and a
    principal per role."""
    for org in ("acme", "globex"):
        await d.create_org(org)
    await d.create_team("acme", "ml")
    await d.create_project("acme", "chat", team="ml")
    await d.create_user("zed")
    out = {}
    for name, role in STAFF.items():
        user = await d.create_user(name)
        await d.set_staff(user.id, role)
        out[name] = Principal(name, staff=role, user=user.id)
    for name, (org, team, mrole) in MEMBERS.items():
        user = await d.create_user(name)
        scope = Scope(org=org, kind="team", name=team) if team else Scope(org=org)
        await d.set_member("", user.id, scope, mrole)
        out[name] = Principal(name, user=user.id)
    return out


def _as_principal(principals: dict[str, Principal]) -> Middleware:
    """An auth middleware for the test: the bearer names the principal (none: nobody)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        name = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if name in principals:
            request[auth.PRINCIPAL] = principals[name]
        return await handler(request)

    return middleware


@pytest.fixture
async def people_port(tmp_path: Path) -> AsyncIterator[str]:
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    principals = await _people_principals(Directory(store))
    mirror = Mirror(Settings(dir=tmp_path, upstream="http://127.0.0.1:9"), Records(store))
    await mirror.start()
    ctx = ApiContext(
        catalog=catalog, nodes=NoNodes(), mint_token=lambda: "t", join_url="", mirror=mirror
    )
    app = web.Application()
    app.add_subapp("/api/v1", api_subapp(ctx, _as_principal(principals)))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url(""))
    await server.close()
    await mirror.close()
    await store.close()


def _passes(role: str, rule: auth.Rule, path: str) -> bool:
    """Who the rule lets through, written out: a staff role it names, or a membership role at
    least rule.member held in the path's organization (acme), or in its team when it names ml."""
    if role in STAFF:
        return STAFF[role] in rule.staff
    if role != "nobody" and rule.user:
        return True  # a user's own things (/me/keys)
    if role == "nobody" or rule.member is None or "/orgs/acme" not in path:
        return False
    org, team, held = MEMBERS[role]
    where = org == "acme" and (not team or f"/teams/{team}/" in path)
    order = ["member", "manager", "admin"]
    return where and order.index(held) >= order.index(rule.member)


async def test_every_served_route_is_in_the_table_with_a_rule() -> None:
    store = await SqliteStore.open(":memory:")
    ctx = ApiContext(catalog=Catalog(store), nodes=NoNodes(), mint_token=lambda: "t", join_url="")
    sub = api_subapp(ctx, _as_principal({}))
    await store.close()
    served = {
        (r.method, r.resource.canonical)
        for r in sub.router.routes()
        if r.method != "HEAD" and r.resource is not None
    }
    table = {(r.method, re.sub(r"\{(\w+):[^}]*\}", r"{\1}", r.path)) for r in routes.TABLE}
    assert served == table
    assert len(routes.TABLE) == len(table) >= 50
    assert all(isinstance(r.rule, auth.Rule) and r.rule.staff for r in routes.TABLE)


OPERATED = ("/api/v1/models", "/api/v1/nodes", "/api/v1/tokens", "/api/v1/mirror", "/api/v1/slurm")
ADMINS_ONLY = ("/api/v1/models/x/price",)  # a price is money: with keys and limits, the admins'
OWN = "/api/v1/me/"  # a person's own keys: every staff role's, as every user's
# Reads sent as POST (the body a change would send), which change nothing: every staff role's.
READS_BY_POST = (("POST", "/api/v1/models/plan"),)


def test_each_route_s_staff_roles_are_the_policy() -> None:
    """Viewers read (GET) everything and change nothing; operators change models, nodes, join
    tokens, the mirror and Slurm; admins everything (keys, limits, prices, servers, people)."""
    for method, path, rule in RULED:
        if method == "GET" or path.startswith(OWN) or (method, path) in READS_BY_POST:
            want = {"admin", "operator", "viewer"}
        elif path.startswith(OPERATED) and path not in ADMINS_ONLY:
            want = {"admin", "operator"}
        else:
            want = {"admin"}
        assert rule.staff == want, (method, path)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("method", "path", "rule"), RULED)
async def test_every_route_passes_exactly_the_roles_of_its_rule(
    people_port: str, method: str, path: str, rule: auth.Rule, role: str
) -> None:
    status = await _status(people_port, method, path, None if role == "nobody" else role)
    if _passes(role, rule, path):
        assert status not in (401, 403), status
    else:
        assert status == (401 if role == "nobody" else 403)


def test_another_organization_s_admin_and_a_viewer_s_writes_never_pass() -> None:
    for method, path, rule in RULED:
        own = path.startswith(OWN)
        assert _passes("globex-admin", rule, path) == rule.user  # only their own keys
        assert _passes("staff-viewer", rule, path) == (
            method == "GET" or own or (method, path) in READS_BY_POST
        )
        assert _passes("staff-admin", rule, path)
