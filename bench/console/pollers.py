"""Console pages left open in browsers, for bench/console/bench.py: each one fetches its page's
polled part (HX-Request, as htmx asks) at the page's own interval, from a random phase, with the
session cookie; prints one JSON object (polls, statuses, latency percentiles in ms).

    python pollers.py '{"url": "http://127.0.0.1:N", "cookie": "...", "duration_s": 10,
                        "pages": [["/console/", 5.0], ...], "n": 50}'
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter
from typing import Any

import aiohttp
import uvloop


async def one(
    url: str, cookie: str, path: str, every: float, until: float, out: list[float], st: Counter[int]
) -> None:
    """One open page: its own connection and cookie, a poll every `every` seconds."""
    headers = {"HX-Request": "true", "Cookie": f"llmgw_console={cookie}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        await asyncio.sleep(random.uniform(0, every))
        while time.monotonic() < until:
            t = time.monotonic()
            async with http.get(url + path, allow_redirects=False) as r:
                await r.read()
                st[r.status] += 1
            out.append(time.monotonic() - t)
            await asyncio.sleep(max(0.0, every - (time.monotonic() - t)))


async def run(cfg: dict[str, Any]) -> dict[str, Any]:
    until = time.monotonic() + float(cfg["duration_s"])
    pages = [(str(p), float(s)) for p, s in cfg["pages"]]
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    await asyncio.gather(
        *(
            one(cfg["url"], cfg["cookie"], *pages[i % len(pages)], until, latencies, statuses)
            for i in range(int(cfg["n"]))
        )
    )
    latencies.sort()
    n = len(latencies)

    def at(q: float) -> float:
        return round(latencies[min(n - 1, int(q * n))] * 1000, 2) if n else 0.0

    return {"polls": n, "statuses": dict(statuses), "p50_ms": at(0.5), "p99_ms": at(0.99)}


if __name__ == "__main__":
    print(json.dumps(uvloop.run(run(json.loads(sys.argv[1])))))
