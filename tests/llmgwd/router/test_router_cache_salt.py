"""vLLM's prefix cache kept apart per organization: the router salts each request to a vLLM
model with its key's organization (a key of none is its own); llama.cpp gets no salt (its
slots: test_router_cache_isolation.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest

from llmgwd.catalog import ApiKey, hash_secret
from llmgwd.router import Router
from tests.llmgwd.router import test_router_v1 as v1
from tests.llmgwd.router.test_router_v1 import FakeEngine, FakeModels, FakePool, endpoint, serve

engine = v1.engine  # its fixture, for the tests here

ALICE, ALICE_2, BOB = "sk-llmgw-alice-0123456789", "sk-llmgw-alice-2-012345", "sk-llmgw-bob-01234"
VLLM_MODEL, LLAMA_MODEL = "smol-vllm", "smol-gguf"


class Keys:
    def __init__(self) -> None:
        self._by_hash = {
            hash_secret(s): ApiKey(id=f"key-{i}", name=s, hash=hash_secret(s), prefix=s[:10])
            for i, s in enumerate((ALICE, ALICE_2, BOB))
        }

    def authenticate(self, secret: str) -> ApiKey | None:
        return self._by_hash.get(hash_secret(secret))


@pytest.fixture
async def post(engine: FakeEngine) -> AsyncIterator[Any]:
    models = FakeModels(VLLM_MODEL, LLAMA_MODEL)
    models._models[VLLM_MODEL] = msgspec.structs.replace(
        models._models[VLLM_MODEL], engine="vllm", source="hf:local/smol@abc"
    )
    pool = FakePool(
        {m: [dataclasses.replace(endpoint(engine.url, m), model=m)] for m in models._models},
        {m: 1 for m in models._models},
    )
    router = Router(Keys(), models, pool, max_body_bytes=64 * 1024)
    async with serve(router) as url, aiohttp.ClientSession() as http:

        async def send(key: str, model: str, **extra: Any) -> tuple[int, dict[str, Any]]:
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
            headers = {"Authorization": f"Bearer {key}"}
            async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
                return r.status, await r.json()

        yield send


async def test_each_account_gets_its_own_salt_and_keeps_it(engine: FakeEngine, post: Any) -> None:
    for key in (ALICE, ALICE, BOB):
        status, _ = await post(key, VLLM_MODEL)
        assert status == 200
    alice, again, bob = (seen.body["cache_salt"] for seen in engine.seen)
    assert alice == again != bob
    # As vLLM asks: long and unpredictable, without '/' or '@'.
    assert len(alice) == 43 and not set(alice) & set("/@\\\0")
    assert ALICE not in alice and "key-0" not in alice


async def test_keys_of_no_organization_are_each_their_own(engine: FakeEngine, post: Any) -> None:
    await post(ALICE, VLLM_MODEL)
    await post(ALICE_2, VLLM_MODEL)
    first, second = (seen.body["cache_salt"] for seen in engine.seen)
    assert first != second


async def test_llama_cpp_gets_no_salt(engine: FakeEngine, post: Any) -> None:
    status, _ = await post(ALICE, LLAMA_MODEL)
    assert status == 200 and "cache_salt" not in engine.seen[0].body


async def test_a_client_cannot_choose_the_salt(engine: FakeEngine, post: Any) -> None:
    status, answer = await post(BOB, VLLM_MODEL, cache_salt="alice's")
    assert status == 400 and answer["error"]["param"] == "cache_salt"
    assert not engine.seen
