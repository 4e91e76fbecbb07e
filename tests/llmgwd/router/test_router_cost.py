"""The router's own cost per request: the pool's ready replicas read once (the daemon's pool
builds them afresh at each read), a prompt hashed only where there is a replica to choose."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from llmgwd.nodes.pool import Endpoint
from llmgwd.router import Balancer, Router
from tests.llmgwd.router.test_router_slots import HEADERS, body, replica
from tests.llmgwd.router.test_router_v1 import (
    MODEL,
    FakeEngine,
    FakeKeys,
    FakeModels,
    FakePool,
    running,
    serve,
)


@dataclass
class CountingPool(FakePool):
    reads: int = 0

    def ready(self, model: str) -> list[Endpoint]:
        self.reads += 1
        return super().ready(model)


async def test_a_request_reads_the_pool_once_and_still_gets_its_headers() -> None:
    async with running(FakeEngine()) as one, running(FakeEngine()) as two:
        pool = CountingPool({MODEL: [replica(one, "r1"), replica(two, "r2")]}, {MODEL: 2})
        router = Router(FakeKeys(), FakeModels(MODEL), pool)
        async with serve(router) as url, aiohttp.ClientSession() as http:
            for n in range(1, 4):
                async with http.post(
                    f"{url}/v1/chat/completions", json=body(f"hi {n}"), headers=HEADERS
                ) as r:
                    assert r.status == 200, await r.text()
                    assert r.headers["x-request-id"]
                    assert float(r.headers["x-llmgw-overhead-ms"]) >= 0
                assert pool.reads == n
        assert len(one.seen) + len(two.seen) == 3


async def test_with_one_replica_no_prompt_is_hashed() -> None:
    async with running(FakeEngine()) as one:
        pool = FakePool({MODEL: [replica(one, "r1")]}, {MODEL: 1})
        balancer = Balancer(pool)
        router = Router(FakeKeys(), FakeModels(MODEL), pool, balancer=balancer)
        async with (
            serve(router) as url,
            aiohttp.ClientSession() as http,
            http.post(f"{url}/v1/chat/completions", json=body("x" * 2000), headers=HEADERS) as r,
        ):
            assert r.status == 200, await r.text()
        assert balancer.prefix is not None
        assert not balancer.prefix._replicas  # nothing remembered: nothing was hashed
