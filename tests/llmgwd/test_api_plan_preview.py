"""POST /api/v1/models/plan: where a model not yet added would go, the same answer GET
/models/{name}/plan gives once it is added, with nothing stored and nothing fetched."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest

from llmgw.api_types import Verdict
from llmgwd.api.access import peercred_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog, Model, profiles_of
from llmgwd.mirror.service import Mirror
from llmgwd.placement.profiles import Profile
from llmgwd.placement.reconciler import Failure, NodeFlags
from llmgwd.placement.scheduler import Placement
from tests.llmgwd.test_api import JOIN_URL, FakeNodes, Tokens, call, serve

MODEL = {"name": "smol", "source": "file:/models/smol.gguf", "engine": "llama.cpp"}


class Scheduling:
    """A reconciler whose verdicts say what they were asked: the model's context and shape."""

    def awake(self, model: Model) -> bool:
        return True

    def flags(self, node: str) -> NodeFlags:
        return NodeFlags()

    async def set_flags(self, node: str, flags: NodeFlags) -> None:
        raise AssertionError("not asked")

    def placements(self) -> list[Placement]:
        return []

    def failures(self) -> list[Failure]:
        return []

    def explain(self, model: Model) -> list[tuple[Profile, list[Verdict]]]:
        why = f"asked at {model.context} tokens, shape {'known' if model.shape else 'unknown'}"
        return [(p, [Verdict("n1", "cores", True, model.context, 0, 0.0, why)])
                for p in profiles_of(model)]  # fmt: skip

    def rollout(self, model: Model) -> str:
        return ""


class NoFetch:
    """A mirror that has resolved nothing, and fails the test if asked to fetch."""

    def snapshot(self, repo: str, revision: str) -> None:
        return None

    async def add(self, src: object) -> Any:
        raise AssertionError("a plan fetched a set")

    async def resolve(self, src: object) -> Any:
        raise AssertionError("a plan asked the upstream")


@pytest.fixture
async def catalog() -> AsyncIterator[Catalog]:
    from llmgwd.store.sqlite import SqliteStore

    store = await SqliteStore.open(":memory:")
    cat = Catalog(store)
    await cat.load()
    yield cat
    await store.close()


@pytest.fixture
def ctx(catalog: Catalog) -> ApiContext:
    return ApiContext(
        catalog=catalog, nodes=FakeNodes(), mint_token=Tokens(), join_url=JOIN_URL,
        scheduling=Scheduling(), mirror=cast(Mirror, NoFetch()),
    )  # fmt: skip


@pytest.fixture
async def client(ctx: ApiContext, tmp_path: Path) -> AsyncIterator[aiohttp.ClientSession]:
    async with serve(api_app(ctx, peercred_auth("llmgw")), tmp_path / "d.sock") as session:
        yield session


async def test_a_new_models_plan_is_the_one_it_has_once_added(
    client: aiohttp.ClientSession, catalog: Catalog
) -> None:
    body = {**MODEL, "context": 4096}
    status, preview = await call(client, "POST", "/models/plan", body)
    assert status == 200, preview
    assert catalog.get("smol") is None  # nothing stored
    assert preview["profiles"][0]["verdicts"][0]["context"] == 4096
    assert not preview["estimates"]  # the file is not on this host: by count, and why
    assert "/models/smol.gguf is not on the control plane" in preview["note"]
    assert (await call(client, "POST", "/models", body))[0] == 201
    assert await call(client, "GET", "/models/smol/plan") == (200, preview)


async def test_a_plan_refuses_what_adding_would(client: aiohttp.ClientSession) -> None:
    status, answer = await call(client, "POST", "/models/plan", {**MODEL, "context": -1})
    assert status == 400 and answer["error"]["param"] == "context"
    assert (await call(client, "POST", "/models", MODEL))[0] == 201
    status, answer = await call(client, "POST", "/models/plan", MODEL)
    assert status == 409 and answer["error"]["code"] == "model_exists"


async def test_an_hf_set_not_fetched_is_planned_by_count_without_fetching(
    client: aiohttp.ClientSession, catalog: Catalog
) -> None:
    body = {"name": "qwen", "source": "hf:Qwen/Qwen3-0.6B-GGUF", "engine": "llama.cpp"}
    status, preview = await call(client, "POST", "/models/plan", body)
    assert status == 200, preview
    assert not preview["estimates"]
    assert "not fetched yet: placed by count" in preview["note"]
    assert catalog.get("qwen") is None
