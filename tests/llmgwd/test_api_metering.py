"""/api/v1 for keys' limits, models' prices and token limits, and usage, on a real Unix socket
over the SQLite store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgwd.accounting.usage import Usage
from llmgwd.api.access import peercred_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.test_api import JOIN_URL, MODEL, FakeNodes, Tokens, call, serve


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(":memory:")
    yield s
    await s.close()


@pytest.fixture
async def catalog(store: SqliteStore) -> Catalog:
    cat = Catalog(store)
    await cat.load()
    return cat


@pytest.fixture
def usage(store: SqliteStore) -> Usage:
    return Usage(store)


@pytest.fixture
async def client(
    catalog: Catalog, usage: Usage, tmp_path: Path
) -> AsyncIterator[aiohttp.ClientSession]:
    ctx = ApiContext(
        catalog=catalog, nodes=FakeNodes(), mint_token=Tokens(), join_url=JOIN_URL, usage=usage
    )
    async with serve(api_app(ctx, peercred_auth("llmgw")), tmp_path / "d.sock") as session:
        yield session


NO_LIMITS = {"rpm": 0, "tpm": 0, "budget_tokens": 0, "budget_tokens_per": "day",
             "budget_spend": 0.0, "budget_spend_per": "day"}  # fmt: skip


async def test_a_key_is_made_with_limits_and_they_change_one_by_one(
    client: aiohttp.ClientSession, store: SqliteStore
) -> None:
    limits = {"rpm": 60, "budget_tokens": 100_000, "budget_tokens_per": "month"}
    status, made = await call(client, "POST", "/keys", {"name": "alice", "limits": limits})
    assert status == 201
    assert made["limits"] == {**NO_LIMITS, **limits}
    status, changed = await call(client, "PATCH", "/keys/alice/limits", {"tpm": 5000, "rpm": 0})
    assert status == 200
    assert changed["limits"] == {**NO_LIMITS, **limits, "tpm": 5000, "rpm": 0}
    _, shown = await call(client, "PATCH", f"/keys/{made['id']}/limits", {})
    assert shown["limits"] == changed["limits"]
    # Kept in the store: a daemon started again sees them.
    again = Catalog(store)
    await again.load()
    assert again.keys()[0].limits.tpm == 5000
    _, [listed] = await call(client, "GET", "/keys")
    assert listed["limits"] == changed["limits"]


@pytest.mark.parametrize(
    ("limits", "param"),
    [
        ({"rpm": -1}, "rpm"),
        ({"tpm": "many"}, "limits.tpm"),
        ({"budget_tokens_per": "week"}, "limits.budget_tokens_per"),
        ({"budget_spend": -0.5}, "budget_spend"),
        ({"burst": 3}, "burst"),
    ],
)
async def test_bad_limits_are_400_naming_the_field(
    client: aiohttp.ClientSession, limits: dict[str, Any], param: str
) -> None:
    status, body = await call(client, "POST", "/keys", {"name": "bob", "limits": limits})
    assert (status, body["error"]["param"]) == (400, param)
    assert (await call(client, "GET", "/keys"))[1] == []
    await call(client, "POST", "/keys", {"name": "bob"})
    status, body = await call(client, "PATCH", "/keys/bob/limits", limits)
    assert (status, body["error"]["param"]) == (400, param.removeprefix("limits."))


async def test_limits_of_an_unknown_key_is_404(client: aiohttp.ClientSession) -> None:
    status, body = await call(client, "PATCH", "/keys/nope/limits", {"rpm": 1})
    assert (status, body["error"]["code"]) == (404, "key_not_found")


async def test_a_model_is_priced_and_limited(client: aiohttp.ClientSession) -> None:
    status, added = await call(
        client, "POST", "/models", {**MODEL, "context": 2048, "max_tokens": 512}
    )
    assert (status, added["max_tokens"], added["price_prompt"]) == (201, 512, 0.0)
    status, priced = await call(
        client, "PUT", "/models/smol/price", {"prompt": 0.5, "completion": 1.5}
    )
    assert (status, priced["price_prompt"], priced["price_completion"]) == (200, 0.5, 1.5)
    assert (await call(client, "GET", "/models/smol"))[1]["price_completion"] == 1.5
    status, body = await call(client, "PUT", "/models/smol/price", {"prompt": -1, "completion": 1})
    assert (status, body["error"]["param"]) == (400, "prompt")
    status, _ = await call(client, "PUT", "/models/nope/price", {"prompt": 1, "completion": 1})
    assert status == 404
    status, body = await call(
        client, "POST", "/models", {**MODEL, "name": "big", "context": 100, "max_tokens": 101}
    )
    assert (status, body["error"]["param"]) == (400, "max_tokens")


async def test_usage_is_summed_by_key_model_and_day(
    client: aiohttp.ClientSession, usage: Usage
) -> None:
    _, alice = await call(client, "POST", "/keys", {"name": "alice"})
    usage.add(("2025-03-01", alice["id"], "smol"), 10, 20, 3_000_000_000_000)
    usage.add(("2025-03-02", alice["id"], "big"), 1, 2, 0)
    await usage.flush()
    usage.add(("2025-03-02", "gone", "smol"), 5, 5, 0)  # not flushed yet; a key since removed
    status, by_key = await call(client, "GET", "/usage?by=key&since=2025-03-01")
    assert status == 200
    assert (by_key["by"], by_key["since"]) == ("key", "2025-03-01")
    assert by_key["rows"] == [
        {"key": alice["id"], "name": "alice", "requests": 2, "prompt_tokens": 11,
         "completion_tokens": 22, "total_tokens": 33, "spend": 3.0},
        {"key": "gone", "name": "", "requests": 1, "prompt_tokens": 5, "completion_tokens": 5,
         "total_tokens": 10, "spend": 0.0},
    ]  # fmt: skip
    assert by_key["total"]["total_tokens"] == 43
    _, by_model = await call(client, "GET", "/usage?by=model&since=2025-03-01")
    assert [(r["model"], r["requests"]) for r in by_model["rows"]] == [("big", 1), ("smol", 2)]
    _, by_day = await call(client, "GET", "/usage?by=day&since=2025-03-02")
    assert [(r["day"], r["requests"]) for r in by_day["rows"]] == [("2025-03-02", 2)]


@pytest.mark.parametrize(("query", "param"), [("by=person", "by"), ("since=March", "since"),
                                              ("since=2025-02-30", "since")])  # fmt: skip
async def test_bad_usage_query_is_400(
    client: aiohttp.ClientSession, query: str, param: str
) -> None:
    status, body = await call(client, "GET", f"/usage?{query}")
    assert (status, body["error"]["param"]) == (400, param)


async def test_usage_defaults_to_this_month(client: aiohttp.ClientSession) -> None:
    status, answer = await call(client, "GET", "/usage")
    assert status == 200
    assert answer["since"].endswith("-01") and answer["rows"] == []
