"""x-llmgw-overhead-ms: llmgw's own time, in every /v1 answer, the engine's time left out."""

from __future__ import annotations

import asyncio
import time

from llmgwd.router.overhead import HEADER
from tests.llmgwd.router.test_router_slots import HEADERS, body, gateway, replica
from tests.llmgwd.router.test_router_v1 import FakeEngine, running

ENGINE_S = 0.5  # the fake engine holds each answer this long


async def slow(gate: asyncio.Event) -> None:
    await asyncio.sleep(ENGINE_S)
    gate.set()


async def test_every_answer_says_what_llmgw_added_without_the_engine_time() -> None:
    engine = FakeEngine(chunks=2, gap_s=0.0)
    async with running(engine), gateway([replica(engine, "r1")]) as (url, _router, http):
        for stream in (False, True):
            engine.gate = asyncio.Event()
            opener = asyncio.create_task(slow(engine.gate))
            started = time.perf_counter()
            ask = {**body("hi"), "stream": stream}
            async with http.post(f"{url}/v1/chat/completions", json=ask, headers=HEADERS) as r:
                assert r.status == 200
                elapsed_ms = (time.perf_counter() - started) * 1000
                spent = float(r.headers[HEADER])
                await r.read()
            await opener
            # The engine's half second is not in it (the client's wait holds both): what is
            # left is well under the client's wait less that half second.
            assert 0 <= spent < elapsed_ms - ENGINE_S * 500, (stream, spent, elapsed_ms)
        async with http.get(f"{url}/v1/models") as r:  # no key: a 401, counted whole
            assert r.status == 401
            assert float(r.headers[HEADER]) >= 0
        async with http.get(f"{url}/v1/models", headers=HEADERS) as r:
            assert r.status == 200
            assert float(r.headers[HEADER]) >= 0
