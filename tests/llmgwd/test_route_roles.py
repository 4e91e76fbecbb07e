"""Every route of the client port's /api/v1 and /hf, taken from their route tables, checks its
role: no key is a 401, a user key is a 403 on /api/v1 and enough on /hf, an admin key passes."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd import api
from llmgwd.api import ApiContext, NodeInfo
from llmgwd.catalog import Catalog
from llmgwd.mirror import hub_server, peers, setup
from llmgwd.mirror.records import Records
from llmgwd.mirror.service import Mirror, Settings
from llmgwd.store.sqlite import SqliteStore

# What each path parameter is given: a well-formed value, so the role is checked, not the path.
SAMPLES = {
    "sha256": "0" * 64,
    "org": "acme",
    "repo": "tiny",
    "revision": "main",
    "path": "config.json",
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


API_ROUTES = _routes("/api/v1", api.api_routes())
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
    app.add_subapp("/api/v1", api.api_subapp(ctx, api.key_auth(catalog)))
    app.add_subapp("/hf", setup.hub(mirror, catalog))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    _, user = await catalog.create_key("u", "user")
    _, admin = await catalog.create_key("a", "admin")
    yield str(server.make_url("")), {"user": user, "admin": admin}
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
    assert len(API_ROUTES) >= 25 and len(HF_ROUTES) >= 5


@pytest.mark.parametrize(("method", "path"), API_ROUTES + HF_ROUTES)
async def test_no_key_is_refused(port: tuple[str, dict[str, str]], method: str, path: str) -> None:
    base, _ = port
    assert await _status(base, method, path, None) == 401
    assert await _status(base, method, path, "sk-llmgw-not-a-key") == 401


@pytest.mark.parametrize(("method", "path"), API_ROUTES)
async def test_api_wants_an_admin(port: tuple[str, dict[str, str]], method: str, path: str) -> None:
    base, keys = port
    assert await _status(base, method, path, keys["user"]) == 403
    assert await _status(base, method, path, keys["admin"]) not in (401, 403)


@pytest.mark.parametrize(("method", "path"), HF_ROUTES)
async def test_hf_takes_any_live_key(
    port: tuple[str, dict[str, str]], method: str, path: str
) -> None:
    base, keys = port
    for role in ("user", "admin"):
        assert await _status(base, method, path, keys[role]) not in (401, 403)
