"""A roll to a larger context half done (placement/rolling.py): one replica still runs with the
old context, one with the new. A prompt only the new one holds goes to it, one neither holds
gets the route's own "context too long", and nothing reaches an engine that cannot hold it;
a short one still goes to either, so the old replica keeps serving until it is replaced."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from llmgwd.catalog import Model
from llmgwd.nodes.pool import Endpoint
from llmgwd.router import Router
from llmgwd.router.balancer import Balancer
from tests.llmgwd.router.test_router_fields import CHAT_PATH, COMPLETIONS, EMBEDDINGS, refused
from tests.llmgwd.router.test_router_v1 import (
    FakeEngine,
    FakeKeys,
    FakeModels,
    FakePool,
    Gateway,
    endpoint,
    serve,
)

ROLLING = "rolling"
OLD, NEW = 4096, 8192  # the context before the roll, and the catalog's now


def words(n: int, first: str = "word") -> str:
    """A text of at least n tokens in any vocabulary, about 5n bytes."""
    return f"{first} " + "word " * (n - 1)


PARAMS = {CHAT_PATH: "messages", COMPLETIONS: "prompt", EMBEDDINGS: "input"}


def body(path: str, n: int, first: str = "word") -> dict[str, Any]:
    """A request of path (a route whose prompt a context bounds) for a prompt of n tokens."""
    text = words(n, first)
    prompt = [{"role": "user", "content": text}] if path == CHAT_PATH else text
    return {"model": ROLLING, PARAMS[path]: prompt}


@dataclass
class Roll:
    gw: Gateway
    old: FakeEngine  # the replica still on the old context
    new: FakeEngine  # the one already rolled

    async def post(self, path: str, tokens: int, first: str) -> tuple[int, dict[str, Any]]:
        """A prompt of tokens starting with first (each its own: no prefix ties it anywhere)."""
        status, answer, _ = await self.gw.post(path, body(path, tokens, first))
        return status, answer


def replica(engine: FakeEngine, name: str, context: int) -> Endpoint:
    return replace(endpoint(engine.url, name), model=ROLLING, context=context)


@pytest.fixture
async def roll() -> AsyncIterator[Roll]:
    old, new = FakeEngine(), FakeEngine()
    servers = [TestServer(e.app(), host="127.0.0.1") for e in (old, new)]
    for engine, server in zip((old, new), servers, strict=True):
        await server.start_server()
        engine.url = str(server.make_url("")).rstrip("/")
    pool = FakePool({ROLLING: [replica(old, "old", OLD), replica(new, "new", NEW)]}, {ROLLING: 2})
    models = FakeModels()
    models.set(Model(name=ROLLING, source="file:/r.gguf", context=NEW))
    router = Router(FakeKeys(), models, pool, max_body_bytes=1024 * 1024)
    try:
        async with serve(router) as url, aiohttp.ClientSession() as http:
            yield Roll(Gateway(url, new, pool, router, http, models), old, new)
    finally:
        for server in servers:
            await server.close()


@pytest.mark.parametrize("path", PARAMS)
async def test_a_prompt_only_the_rolled_replica_holds_goes_to_it(roll: Roll, path: str) -> None:
    for i in range(6):  # the balancer would alternate between two idle replicas
        status, answer = await roll.post(path, 6000, f"w{i}")
        assert status == 200, answer
    assert len(roll.new.seen) == 6
    assert not roll.old.seen  # it would have answered llama-server's exceed_context_size_error


@pytest.mark.parametrize("path", PARAMS)
async def test_a_prompt_no_replica_holds_gets_the_routes_own_error(roll: Roll, path: str) -> None:
    answer = await refused(roll.gw, path, body(path, 9000), "context_length_exceeded", PARAMS[path])
    assert f"maximum context length is {NEW} tokens" in answer["error"]["message"]
    assert not roll.old.seen


async def test_short_prompts_still_reach_the_replica_not_yet_rolled(roll: Roll) -> None:
    for i in range(6):
        assert (await roll.post(CHAT_PATH, 10, f"w{i}"))[0] == 200
    assert roll.old.seen and roll.new.seen


async def test_before_any_replica_rolled_the_old_context_bounds_the_prompt(roll: Roll) -> None:
    roll.gw.pool.endpoints[ROLLING] = [replica(roll.old, "old", OLD)]
    long = body(CHAT_PATH, 6000)
    answer = await refused(roll.gw, CHAT_PATH, long, "context_length_exceeded", "messages")
    assert f"maximum context length is {OLD} tokens" in answer["error"]["message"]
    assert not roll.old.seen


async def test_a_long_prompt_waits_for_the_rolled_replica_not_for_any_slot() -> None:
    old = Endpoint("old", ROLLING, "n1", "http://old", "", slots=1, context=OLD)
    new = Endpoint("new", ROLLING, "n2", "http://new", "", slots=1, context=NEW)
    balancer = Balancer(FakePool({ROLLING: [old, new]}, {ROLLING: 2}))
    taken = [await balancer.acquire(ROLLING), await balancer.acquire(ROLLING)]
    assert {e.replica_id for e in taken if e is not None} == {"old", "new"}  # both full now
    waiting = asyncio.create_task(balancer.acquire(ROLLING, need=NEW))
    await asyncio.sleep(0.05)
    balancer.release(old)  # a slot on the old replica: not for this request
    await asyncio.sleep(0.05)
    assert not waiting.done()
    balancer.release(new)
    chosen = await asyncio.wait_for(waiting, 1)
    assert chosen is not None and chosen.replica_id == "new"
