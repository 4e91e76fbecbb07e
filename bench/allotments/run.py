"""Allotments (issue 11): the store writes one and three control planes make under a steady
request load, and how many requests a requests-per-minute limit lets through across them.

Each control plane is a Meter with its own in-memory Usage and its own Allotments, over one
store: a SQLite file (default) or, with --etcd, a three-member etcd on loopback (each plane
talking to its own member). The load is open-loop at --rate requests a second over --keys
keys (each with a day's budget of 500,000 tokens and one of spend, rpm 2000 and tpm 200,000,
none of which the load reaches: a share aims at 10 s of use, so they are refilled), every
request in flight for 20 ms; the store's writes are counted by what they write (allotment
ledgers, usage, leases) over the steady part (after a 2 s warm-up). Then a key with
rpm N is hammered through the planes at once (eight clients each, back to back): passed
against N, and against what per-process counting lets through (N on each plane); with
--sustained S, the same key is offered 2N a minute for S seconds and the most requests
admitted in any 60 s window is printed (the bound is N). Last, a key with a budget of
--budget tokens is spent through them all at once until each client is refused.

    bench/allotments/run [--rate 300] [--seconds 10] [--rpm 120] [--budget 30000]
                         [--sustained 0] [--etcd]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "llmgwd" / "src"))
sys.path.insert(0, str(ROOT / "src"))

from llmgwd.accounting.allotments import Allotments  # noqa: E402
from llmgwd.accounting.shares import Refill  # noqa: E402
from llmgwd.accounting.usage import Usage  # noqa: E402
from llmgwd.catalog import ApiKey, KeyLimits, Model  # noqa: E402
from llmgwd.router import ApiError  # noqa: E402
from llmgwd.router.metering import Meter  # noqa: E402
from llmgwd.router.token_bounds import Estimate  # noqa: E402
from llmgwd.store import KV, Compare, Delete, Get, Put, Store, TxnResult  # noqa: E402
from llmgwd.store.sqlite import SqliteStore  # noqa: E402

MODEL = Model(name="smol", source="file:/m.gguf", price_prompt=1.0, price_completion=2.0)
ASK = Estimate(prompt=50, completion=100)
ANSWER = json.dumps({"usage": {"prompt_tokens": 30, "completion_tokens": 70}}).encode()
IN_FLIGHT_S = 0.02
WARMUP_S = 2.0


class Counting:
    """A store that counts the writes made through it, by the first key each writes."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.writes: Counter[str] = Counter()

    def _count(self, key: str) -> None:
        self.writes["/" + key.split("/")[1]] += 1

    async def get(self, key: str) -> KV | None:
        return await self.store.get(key)  # type: ignore[no-any-return]

    async def range(self, key: str, end: str | None = None, **kw: int) -> tuple[list[KV], int]:
        return await self.store.range(key, end, **kw)  # type: ignore[no-any-return]

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        self._count(key)
        return await self.store.put(key, value, lease=lease)  # type: ignore[no-any-return]

    async def txn(
        self,
        compare: list[Compare],
        success: list[Put | Delete | Get],
        failure: list[Put | Delete | Get] | None = None,
    ) -> TxnResult:
        result: TxnResult = await self.store.txn(compare, success, failure)
        ops = success if result.succeeded else failure or []
        writes = [op for op in ops if not isinstance(op, Get)]
        if writes:
            self._count(writes[0].key)
        return result

    async def lease_keepalive(self, lease: int) -> float:
        self.writes["lease keepalive"] += 1
        return await self.store.lease_keepalive(lease)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


class Plane:
    """One control plane: a Meter over its Usage and its Allotments, and what it saw."""

    def __init__(self, store: Counting, shared: bool) -> None:
        self.store = store
        self.usage = Usage(store, interval_s=5.0)
        self.shares = Allotments(store) if shared else None
        self.meter = Meter(self.usage, shares=self.shares)
        self.waited = self.answered = self.refused = 0
        self.admitted_at: list[float] = []
        if self.shares is not None:
            check = self.shares.check

            def counted(*a: Any, **kw: Any) -> Any:
                got = check(*a, **kw)
                if isinstance(got, Refill):
                    self.waited += 1
                return got

            self.shares.check = counted  # type: ignore[method-assign]

    async def start(self) -> None:
        self.usage.start()
        if self.shares is not None:
            await self.shares.start()

    async def stop(self) -> None:
        if self.shares is not None:
            await self.shares.stop()
        await self.usage.stop()

    async def request(self, key: ApiKey, in_flight_s: float = IN_FLIGHT_S) -> None:
        try:
            r = await self.meter.reserve(key, MODEL, ASK)
        except ApiError as e:
            self.refused += 1
            if self.refused <= 3 and e.detail.code not in ("rate_limit_exceeded",):
                print("refused:", e.detail.message, file=sys.stderr)
            return
        self.admitted_at.append(time.monotonic())
        await asyncio.sleep(in_flight_s)
        r.tally.whole(200, ANSWER)
        r.settle()
        self.answered += 1


@contextlib.asynccontextmanager
async def stores(n: int, etcd: bool, tmp: Path) -> AsyncIterator[list[Store]]:
    """n stores over one backend: one SQLite file shared, or a member of one etcd each."""
    if not etcd:
        store = await SqliteStore.open(tmp / "state.db")
        try:
            yield [store] * n
        finally:
            await store.close()
        return
    from llmgwd.store.etcd import EtcdStore  # B's backend: only with --etcd
    from tests.llmgwd.store.local_etcd import cluster

    with cluster(tmp / "etcd", 3) as members:
        opened = [
            await EtcdStore.open(
                m.endpoint, ca_file=m.ca_file, cert_file=m.cert_file, key_file=m.key_file
            )
            for m in members[:n]
        ]
        try:
            yield opened  # type: ignore[misc]
        finally:
            for s in opened:
                await s.close()


def limited(i: int) -> ApiKey:
    limits = KeyLimits(budget_tokens=500_000, budget_spend=1000.0, rpm=2000, tpm=200_000)
    return ApiKey(id=f"key{i}", name=f"k{i}", hash="", prefix="sk", limits=limits)


async def steady(planes: list[Plane], rate: float, seconds: float, keys: int) -> dict[str, Any]:
    """Open-loop load; store writes per second over the steady part."""
    counted = {id(p.store): p.store for p in planes}.values()
    ks = [limited(i) for i in range(keys)]
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    start = loop.time()
    before: Counter[str] = Counter()
    for n in itertools.count():
        at = start + n / rate
        if at > start + WARMUP_S + seconds:
            break
        if not before and at >= start + WARMUP_S:
            before = sum((s.writes for s in counted), Counter())
            waited_before = sum(p.waited for p in planes)
        await asyncio.sleep(max(0.0, at - loop.time()))
        task = asyncio.create_task(planes[n % len(planes)].request(random.choice(ks)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    after = sum((s.writes for s in counted), Counter())
    await asyncio.gather(*tasks)
    return {
        "writes/s": {k: round((after[k] - before[k]) / seconds, 2) for k in sorted(after)},
        "requests/s": round(rate, 1),
        "answered": sum(p.answered for p in planes),
        "refused": sum(p.refused for p in planes),
        "waited for a refill (steady part)": sum(p.waited for p in planes) - waited_before,
    }


async def hammer(planes: list[Plane], rpm: int, each: int) -> int:
    """Eight clients per plane sending each requests back to back; how many passed."""
    key = ApiKey(id="rpm", name="rpm", hash="", prefix="sk", limits=KeyLimits(rpm=rpm))

    async def client(p: Plane) -> None:
        for _ in range(each):
            await p.request(key, 0.0)

    answered = sum(p.answered for p in planes)
    await asyncio.gather(*(client(p) for p in planes for _ in range(8)))
    return sum(p.answered for p in planes) - answered


async def spend(planes: list[Plane], budget: int) -> int:
    """Eight clients per plane spending a key's budget of tokens until each is refused; the
    tokens spent (100 a request)."""
    limits = KeyLimits(budget_tokens=budget)
    key = ApiKey(id="budget", name="budget", hash="", prefix="sk", limits=limits)

    async def client(p: Plane) -> None:
        refused = p.refused
        while p.refused == refused:
            await p.request(key, 0.0)

    answered = sum(p.answered for p in planes)
    await asyncio.gather(*(client(p) for p in planes for _ in range(8)))
    return (sum(p.answered for p in planes) - answered) * 100


async def sustained(planes: list[Plane], rpm: int, seconds: float) -> int:
    """2N a minute offered for seconds; the most admitted in any 60 s window."""
    key = ApiKey(id="sus", name="sus", hash="", prefix="sk", limits=KeyLimits(rpm=rpm))
    first = [len(p.admitted_at) for p in planes]
    interval = 60.0 / (2 * rpm)
    tasks = []
    for n in range(int(seconds / interval)):
        tasks.append(asyncio.create_task(planes[n % len(planes)].request(key, 0.0)))
        await asyncio.sleep(interval)
    await asyncio.gather(*tasks)
    times = sorted(t for p, i in zip(planes, first, strict=True) for t in p.admitted_at[i:])
    return max((bisect.bisect_left(times, t + 60.0) - i for i, t in enumerate(times)), default=0)


async def scenario(n: int, shared: bool, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    async with stores(n, args.etcd, tmp) as ss:
        counting = {id(s): Counting(s) for s in ss}
        planes = [Plane(counting[id(s)], shared) for s in ss]
        for p in planes:
            await p.start()
        try:
            out: dict[str, Any] = {"planes": n, "shared": shared}
            if shared:
                out["steady"] = await steady(planes, args.rate, args.seconds, args.keys)
            out[f"rpm {args.rpm} hammered"] = await hammer(planes, args.rpm, args.rpm // 4)
            out[f"budget {args.budget} tokens spent"] = await spend(planes, args.budget)
            if args.sustained and shared:
                out[
                    f"rpm {args.rpm}, most in any 60 s of {args.sustained} s at 2N/min"
                ] = await sustained(planes, args.rpm, args.sustained)
            return out
        finally:
            for p in planes:
                await p.stop()


async def main(args: argparse.Namespace) -> None:
    backend = "etcd (3 members, one per plane)" if args.etcd else "SQLite (one file)"
    print(f"store: {backend}; load {args.rate} req/s over {args.keys} keys, {args.seconds} s")
    for n, shared in ((1, True), (3, True), (3, False)):
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(await scenario(n, shared, args, Path(tmp))), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--rpm", type=int, default=120)
    parser.add_argument("--budget", type=int, default=30_000)
    parser.add_argument("--sustained", type=float, default=0.0)
    parser.add_argument("--etcd", action="store_true")
    asyncio.run(main(parser.parse_args()))
