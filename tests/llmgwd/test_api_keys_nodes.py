"""/api/v1 keys found by id or name without ambiguity, and node removal, on a real Unix socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from llmgwd.api.access import key_auth, peercred_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.test_api import JOIN_URL, FakeNodes, Tokens, call, serve


@pytest.fixture
async def catalog() -> AsyncIterator[Catalog]:
    store = await SqliteStore.open(":memory:")
    cat = Catalog(store)
    await cat.load()
    yield cat
    await store.close()


class Removals:
    """ctx.remove_node: the names it was asked to remove; only 'n1' is a node."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, name: str) -> bool:
        self.asked.append(name)
        return name == "n1"


@pytest.fixture
def removals() -> Removals:
    return Removals()


@pytest.fixture
def ctx(catalog: Catalog, removals: Removals) -> ApiContext:
    return ApiContext(
        catalog=catalog,
        nodes=FakeNodes(),
        mint_token=Tokens(),
        join_url=JOIN_URL,
        remove_node=removals,
    )


@pytest.fixture
async def client(ctx: ApiContext, tmp_path: Path) -> AsyncIterator[aiohttp.ClientSession]:
    async with serve(api_app(ctx, peercred_auth("llmgw")), tmp_path / "d.sock") as session:
        yield session


@pytest.fixture
async def keyed(ctx: ApiContext, tmp_path: Path) -> AsyncIterator[aiohttp.ClientSession]:
    async with serve(api_app(ctx, key_auth(ctx.catalog)), tmp_path / "k.sock") as session:
        yield session


async def status_with(keyed: aiohttp.ClientSession, secret: str) -> int:
    headers = {"Authorization": f"Bearer {secret}"}
    async with keyed.get("/api/v1/status", headers=headers) as resp:
        return resp.status


async def test_revoke_by_name_takes_the_active_key_of_two_named_alike(
    client: aiohttp.ClientSession, keyed: aiohttp.ClientSession
) -> None:
    _, old = await call(client, "POST", "/keys", {"name": "ci", "role": "admin"})
    assert (await call(client, "DELETE", f"/keys/{old['id']}"))[0] == 200
    _, new = await call(client, "POST", "/keys", {"name": "ci", "role": "admin"})
    assert await status_with(keyed, new["key"]) == 200

    status, revoked = await call(client, "DELETE", "/keys/ci")

    assert (status, revoked["id"], revoked["revoked"]) == (200, new["id"], True)
    assert await status_with(keyed, new["key"]) == 401
    # Each by its id: the revoked one says so, and no name is consulted.
    for made in (old, new):
        status, again = await call(client, "DELETE", f"/keys/{made['id']}")
        assert (status, again["id"], again["revoked"]) == (200, made["id"], True)
    # No active key has that name now.
    status, body = await call(client, "DELETE", "/keys/ci")
    assert (status, body["error"]["code"]) == (404, "key_not_found")


async def test_two_active_keys_of_one_name_are_a_409_naming_their_ids(
    client: aiohttp.ClientSession, catalog: Catalog
) -> None:
    # The API refuses a second active name; the store may still hold two (a race, an import).
    a, secret_a = await catalog.create_key("ci")
    b, _ = await catalog.create_key("ci")

    status, body = await call(client, "DELETE", "/keys/ci")

    assert (status, body["error"]["code"], body["error"]["type"]) == (
        409,
        "key_ambiguous",
        "conflict_error",
    )
    assert a.id in body["error"]["message"] and b.id in body["error"]["message"]
    assert catalog.authenticate(secret_a) is not None  # nothing revoked
    status, body = await call(client, "DELETE", f"/keys/{a.id}")
    assert (status, body["id"]) == (200, a.id)
    assert catalog.authenticate(secret_a) is None
    assert [k.revoked for k in list(catalog.keys())] == [True, False]


async def test_an_id_finds_exactly_its_key_even_where_a_name_looks_like_it(
    client: aiohttp.ClientSession, catalog: Catalog
) -> None:
    # Made before names were checked: a key named as another key's id (the old code
    # matched both and answered 500, revoking neither).
    target, secret = await catalog.create_key("alice")
    _, other_secret = await catalog.create_key(target.id)

    status, body = await call(client, "DELETE", f"/keys/{target.id}")

    assert (status, body["id"], body["name"]) == (200, target.id, "alice")
    assert catalog.authenticate(secret) is None
    assert catalog.authenticate(other_secret) is not None


@pytest.mark.parametrize("name", ["0123456789ab", "ABCDEF012345"])
async def test_a_key_name_may_not_look_like_an_id(client: aiohttp.ClientSession, name: str) -> None:
    status, body = await call(client, "POST", "/keys", {"name": name})
    assert (status, body["error"]["param"]) == (400, "name")
    assert "id" in body["error"]["message"]


async def test_node_remove_route(client: aiohttp.ClientSession, removals: Removals) -> None:
    said = {"name": "n1", "removed": True, "known": True}
    assert await call(client, "DELETE", "/nodes/n1") == (200, said)
    # A name not known here is revoked all the same (a node that joined before membership
    # records were kept and has not connected since start is not known here).
    said = {"name": "ghost", "removed": True, "known": False}
    assert await call(client, "DELETE", "/nodes/ghost") == (200, said)
    status, body = await call(client, "DELETE", "/nodes/-bad")
    assert (status, body["error"]["param"]) == (400, "name")
    assert removals.asked == ["n1", "ghost"]


async def test_node_remove_needs_an_admin_key(
    keyed: aiohttp.ClientSession, catalog: Catalog, removals: Removals
) -> None:
    _, user = await catalog.create_key("u")
    headers = {"Authorization": f"Bearer {user}"}
    async with keyed.delete("/api/v1/nodes/n1", headers=headers) as resp:
        assert resp.status == 403
    async with keyed.delete("/api/v1/nodes/n1") as resp:
        assert resp.status == 401
    assert removals.asked == []
