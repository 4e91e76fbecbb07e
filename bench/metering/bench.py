"""bench/metering: the tokens a real engine made against the tokens the router charged, on every
generating route, streamed and not, with clients that leave at random points (issue 26).

A real llama-server (SmolLM2-135M, two slots) on a loopback port behind the router run in this
process, as in production but for the daemon around it. For each route (chat, completions,
messages, responses) and each way (a stream, a whole answer), ROUNDS requests one after the
other, each with a random max_tokens; a third are read to their end, the others are left after
a random time (a stream after a random number of its events). Printed per group: requests, how
many were left, the tokens the engine made (llama-server's /metrics tokens_predicted_total,
read before and after the group) and the completion tokens the Meter charged, and their
difference; then the totals.

    flock /tmp/llmgw-integration.lock .venv/bin/python bench/metering/bench.py [--rounds 12]

It prints figures only, never passes or fails; the engine it starts is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.prefix.bench import (  # noqa: E402
    ENGINE_KEY,
    KEY,
    MODEL,
    SLOTS,
    Keys,
    Models,
    Pool,
    engines,
    free_port,
)
from llmgwd.nodes.pool import Endpoint  # noqa: E402
from llmgwd.router import Balancer, Router  # noqa: E402
from llmgwd.router.metering import Meter  # noqa: E402

ROUTES = ("chat/completions", "completions", "messages", "responses")
PROMPT = "Tell me a long story about a dragon who learns to paint."


def body(path: str, stream: bool, most: int) -> dict[str, Any]:
    """A request on path that may make up to `most` tokens."""
    doc: dict[str, Any] = {"model": MODEL, "stream": stream, "temperature": 0.8}
    if path == "completions":
        doc["prompt"] = PROMPT
    elif path == "responses":
        doc["input"] = PROMPT
    else:
        doc["messages"] = [{"role": "user", "content": PROMPT}]
    doc["max_output_tokens" if path == "responses" else "max_tokens"] = most
    return doc


async def made(http: aiohttp.ClientSession, url: str) -> int:
    """The tokens the engine made so far (its /metrics)."""
    headers = {"Authorization": f"Bearer {ENGINE_KEY}"}
    async with http.get(f"{url}/metrics", headers=headers) as r:
        for line in (await r.text()).splitlines():
            if line.startswith("llamacpp:tokens_predicted_total "):
                return int(float(line.split()[1]))
    raise RuntimeError("the engine's /metrics has no tokens_predicted_total")


async def one(
    http: aiohttp.ClientSession, url: str, path: str, stream: bool, rng: random.Random
) -> bool:
    """One request, left early (True) or read to its end (False)."""
    leave = rng.random() < 2 / 3
    doc = body(path, stream, rng.randint(32, 160))
    headers = {"Authorization": f"Bearer {KEY}"}
    post = http.post(f"{url}/v1/{path}", json=doc, headers=headers)
    if not stream:
        try:
            async with asyncio.timeout(rng.uniform(0.1, 1.2) if leave else None):
                async with post as r:
                    await r.read()
            return False
        except TimeoutError:
            return True
    async with post as r:
        events, stop = 0, rng.randint(1, 60) if leave else None
        async for _ in r.content:
            events += 1
            if stop is not None and events >= stop:
                r.close()
                return True
    return False


async def settled(router: Router) -> None:
    """Until every request left early has been read to its engine's end and settled."""
    upstream = router._upstream  # the bench looks inside: drains still running
    for _ in range(600):
        if not upstream._drains:
            return
        await asyncio.sleep(0.05)


async def charged(meter: Meter) -> int:
    return sum(r.counts.completion_tokens for r in await meter.usage.records(""))


@asynccontextmanager
async def gateway(engine_url: str) -> AsyncIterator[tuple[str, Router, Meter]]:
    endpoint = Endpoint("r1", MODEL, "n1", engine_url, ENGINE_KEY, slots=SLOTS, context=4096)
    pool = Pool([endpoint])
    meter = Meter()
    router = Router(Keys(), Models(), pool, meter=meter, balancer=Balancer(pool))
    root = web.Application()
    root.add_subapp("/v1", router.app)
    runner = web.AppRunner(root, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", router, meter
    finally:
        await runner.cleanup()


@asynccontextmanager
async def engine(url: str | None) -> AsyncIterator[str]:
    """The llama-server at url (started with --metrics), else one started here."""
    if url is not None:
        yield url
        return
    async with engines(1, []) as urls:
        yield urls[0]


async def run(rounds: int, seed: int, engine_url: str | None) -> None:
    rng = random.Random(seed)
    print(f"{'route':18} {'way':6} {'requests':>8} {'left':>5} {'engine made':>11} "
          f"{'charged':>8} {'charged-made':>12}")  # fmt: skip
    totals = [0, 0, 0, 0]
    async with (
        engine(engine_url) as real,
        gateway(real) as (url, router, meter),
        aiohttp.ClientSession() as http,
    ):
        for path in ROUTES:
            for stream in (True, False):
                before, was = await made(http, real), await charged(meter)
                left = 0
                for _ in range(rounds):
                    left += await one(http, url, path, stream, rng)
                await settled(router)
                await asyncio.sleep(0.3)  # the engine's last task ends
                engine_made = await made(http, real) - before
                billed = await charged(meter) - was
                way = "stream" if stream else "whole"
                print(f"{path:18} {way:6} {rounds:8} {left:5} {engine_made:11} {billed:8} "
                      f"{billed - engine_made:12}")  # fmt: skip
                for i, n in enumerate((rounds, left, engine_made, billed)):
                    totals[i] += n
    print(f"{'all':18} {'':6} {totals[0]:8} {totals[1]:5} {totals[2]:11} {totals[3]:8} "
          f"{totals[3] - totals[2]:12}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12, help="requests per route and way")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--engine-url", help="a running llama-server (--metrics) to use")
    args = parser.parse_args()
    print(f"seed {args.seed}")
    asyncio.run(run(args.rounds, args.seed, args.engine_url))


if __name__ == "__main__":
    main()
