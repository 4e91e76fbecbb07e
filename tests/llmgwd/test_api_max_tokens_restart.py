"""PUT /api/v1/models/{name}/max_tokens bounds the model's next /v1 request with no restart (the
router reads the same catalog), and POST /api/v1/models/{name}/restart raises its generation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgwd.api.access import peercred_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog
from llmgwd.router import Router
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.router.test_router_v1 import (  # noqa: F401 (engine: a fixture)
    USER_SECRET,
    FakeEngine,
    FakeKeys,
    FakePool,
    endpoint,
    engine,
)
from tests.llmgwd.router.test_router_v1 import serve as serve_v1
from tests.llmgwd.test_api import JOIN_URL, MODEL, FakeNodes, Tokens, call, serve

NAME = MODEL["name"]
CHAT_PATH = "/v1/chat/completions"


@dataclass
class Both:
    api: aiohttp.ClientSession  # /api/v1 on its Unix socket
    v1: str  # the router's address
    http: aiohttp.ClientSession
    engine: FakeEngine
    catalog: Catalog

    async def chat(self, **fields: object) -> tuple[int, dict[str, Any]]:
        body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], **fields}
        headers = {"Authorization": f"Bearer {USER_SECRET}"}
        async with self.http.post(f"{self.v1}{CHAT_PATH}", json=body, headers=headers) as resp:
            return resp.status, await resp.json()


@pytest.fixture
async def both(engine: FakeEngine, tmp_path: Path) -> AsyncIterator[Both]:  # noqa: F811
    """/api/v1 and the /v1 router over one catalog, as the daemon runs them."""
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    ctx = ApiContext(catalog=catalog, nodes=FakeNodes(), mint_token=Tokens(), join_url=JOIN_URL)
    pool = FakePool({NAME: [endpoint(engine.url, NAME)]}, {NAME: 1})
    router = Router(FakeKeys(), catalog, pool, max_body_bytes=64 * 1024)
    async with (
        serve(api_app(ctx, peercred_auth("llmgw")), tmp_path / "d.sock") as api,
        serve_v1(router) as url,
        aiohttp.ClientSession() as http,
    ):
        yield Both(api, url, http, engine, catalog)
    await store.close()


async def test_the_next_request_is_bound_by_a_new_max_tokens(both: Both) -> None:
    status, _ = await call(both.api, "POST", "/models", {**MODEL, "context": 2048})
    assert status == 201
    assert (await both.chat(max_tokens=1000))[0] == 200
    status, changed = await call(both.api, "PUT", f"/models/{NAME}/max_tokens", {"max_tokens": 512})
    assert (status, changed["max_tokens"]) == (200, 512)
    status, answer = await both.chat(max_tokens=1000)
    assert status == 400
    assert answer["error"] == answer["error"] | {"param": "max_tokens", "code": "invalid_value"}
    assert (await both.chat())[0] == 200
    assert [s.body["max_tokens"] for s in both.engine.seen] == [1000, 512]
    # 0: bound by the context again
    await call(both.api, "PUT", f"/models/{NAME}/max_tokens", {"max_tokens": 0})
    assert (await both.chat(max_tokens=1000))[0] == 200


@pytest.mark.parametrize("body", [{"max_tokens": 4096}, {"max_tokens": -1}, {"tokens": 5}])
async def test_a_max_tokens_over_the_context_or_malformed_is_400(
    both: Both, body: dict[str, object]
) -> None:
    await call(both.api, "POST", "/models", {**MODEL, "context": 2048})
    status, answer = await call(both.api, "PUT", f"/models/{NAME}/max_tokens", body)
    assert status == 400, answer
    assert both.catalog.get(NAME).max_tokens == 0  # type: ignore[union-attr]


async def test_restart_raises_the_generation_and_unknown_models_are_404(both: Both) -> None:
    await call(both.api, "POST", "/models", MODEL)
    for want in (1, 2):
        status, _ = await call(both.api, "POST", f"/models/{NAME}/restart")
        assert status == 200
        assert both.catalog.get(NAME).generation == want  # type: ignore[union-attr]
    assert (await call(both.api, "POST", "/models/nope/restart"))[0] == 404
    assert (await call(both.api, "PUT", "/models/nope/max_tokens", {"max_tokens": 1}))[0] == 404
