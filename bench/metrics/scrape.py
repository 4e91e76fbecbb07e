"""How long a /metrics scrape holds llmgwd's event loop, and how long it takes, with the series
built and formatted on the loop (as before) and in a worker thread (llmgwd.metrics.scrape).

A cluster of NODES nodes of eight H100 cards each (the recorded NVML answers of a DGX H100),
four replicas a node, 50 models in the catalog with traffic counted on every router series.
While each scrape runs, a task on the loop wakes every millisecond: the loop's longest stall
is its longest late wake-up. Figures only (median and worst of --scrapes):

    .venv/bin/python bench/metrics/scrape.py [--nodes 10,100] [--models 50] [--scrapes 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from llmgw.wire import ReplicaStatus  # noqa: E402
from llmgwd.metrics import endpoint  # noqa: E402
from llmgwd.metrics.cluster import ClusterCollector  # noqa: E402
from llmgwd.metrics.gpus import GpuCollector  # noqa: E402
from llmgwd.metrics.scrape import Scraper  # noqa: E402
from llmgwd.nodes.state import NodeInfo  # noqa: E402
from llmgwd.router.metrics import RouterMetrics  # noqa: E402
from tests.llmgw_agentd.nvml_inventory import load, recorded  # noqa: E402

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")


class Pool:
    def __init__(self, ready: int) -> None:
        self._ready = [object()] * ready

    def wanted(self, model: str) -> int:
        return len(self._ready)

    def ready(self, model: str) -> list[Any]:
        return self._ready


def nodes(count: int, models: list[str]) -> list[NodeInfo]:
    inventory = recorded(load("dgx-h100-8x80gb"))
    out = []
    for i in range(count):
        replicas = tuple(ReplicaStatus(f"r{i}-{j}", models[(4 * i + j) % len(models)], "ready")
                         for j in range(4))  # fmt: skip
        out.append(NodeInfo(f"node-{i:03d}", "10.0.0.1", "1", inventory, replicas, None, True, 0.0))
    return out


def router(models: list[str]) -> CollectorRegistry:
    """The router's registry with every series of every model counted."""
    registry = CollectorRegistry()
    m = RouterMetrics(registry, lambda name: True)
    for model in models:
        for route in ROUTES:
            for status in ("2xx", "4xx", "5xx"):
                m.requests.labels(model, route, status).inc()
        m.duration.labels(model).observe(0.3)
        m.first_token.labels(model).observe(0.05)
        m.settled(model, 100, 20, 5)
        m.waited(model, 0.01)
        m.woke(model, 2.0, True)
        m.refusals.labels(model, "rate_limit").inc()
    return registry


class Ticker:
    """A task that wakes every millisecond and notes how late it woke at worst."""

    def __init__(self) -> None:
        self.stall, self.done = 0.0, False

    async def run(self) -> None:
        while not self.done:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            self.stall = max(self.stall, time.perf_counter() - t - 0.001)


async def measure(render: Callable[[], Awaitable[bytes]], scrapes: int) -> list[tuple[float, ...]]:
    """(loop's longest stall ms, scrape ms, bytes) of each scrape."""
    rows: list[tuple[float, ...]] = []
    for _ in range(scrapes):
        ticker = Ticker()
        task = asyncio.create_task(ticker.run())
        await asyncio.sleep(0.005)
        ticker.stall, started = 0.0, time.perf_counter()
        text = await render()
        total = time.perf_counter() - started
        ticker.done = True
        await task
        rows.append((ticker.stall * 1000, total * 1000, len(text)))
    return rows


def renders(count: int, models: list[str]) -> dict[str, Callable[[], Awaitable[bytes]]]:
    cluster = nodes(count, models)
    pool, grace = Pool(2), 60.0
    state: list[ClusterCollector | GpuCollector] = [
        ClusterCollector(lambda: models, pool, lambda: cluster, lambda m: 0, grace),
        GpuCollector(lambda: cluster),
    ]
    on_loop = router(models)
    for collector in state:
        on_loop.register(collector)
    return {"on the loop": endpoint.of(on_loop),
            "in a thread": Scraper(router(models), state).render}  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="10,100")
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args()
    models = [f"model-{i:02d}" for i in range(args.models)]
    print(f"{args.models} models, 8 H100 a node, {args.scrapes} scrapes each; median (worst)")
    for count in (int(n) for n in args.nodes.split(",")):
        for how, render in renders(count, models).items():
            rows = await measure(render, args.scrapes)
            stall, total = ([r[i] for r in rows] for i in (0, 1))
            print(f"{count:4d} nodes, {how}: loop held {statistics.median(stall):6.1f} ms "
                  f"({max(stall):.1f}), scrape {statistics.median(total):6.1f} ms "
                  f"({max(total):.1f}), {rows[-1][2] / 1000:.0f} kB")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
