"""The store's latency on SQLite and on a three-member etcd on this machine: reads (a key, a
prefix of 100 keys), writes (one at a time, and 16 at once), and a watch's latency (from the
put's call to the event seen by a watcher), each as median and p99, and etcd/SQLite.

etcd: three etcd processes on loopback (TLS between peers and to clients, as llmgw runs them:
each started from the config llmgwd.planes.etcd_member writes), llmgwd's EtcdStore on one of them,
the leader or a follower (--follower). SQLite: SqliteStore on a file in the same temp dir.

    .venv/bin/python bench/store/run.py [--n 500] [--follower]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from llmgwd.store.base import Store, prefix_end  # noqa: E402
from llmgwd.store.etcd import EtcdStore  # noqa: E402
from llmgwd.store.sqlite import SqliteStore  # noqa: E402
from tests.llmgwd.store import local_etcd  # noqa: E402

Figures = dict[str, list[float]]  # what -> latencies in ms


async def timed(n: int, step: Callable[[int], Awaitable[object]]) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await step(i)
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def concurrent_writes(store: Store, n: int, width: int = 16) -> list[float]:
    """Latency of each put while width puts are in flight at once."""
    out: list[float] = []

    async def writer(w: int) -> None:
        for i in range(n // width):
            t0 = time.perf_counter()
            await store.put(f"bench/c/{w}/{i}", b"x" * 200)
            out.append((time.perf_counter() - t0) * 1000)

    await asyncio.gather(*(writer(w) for w in range(width)))
    return out


async def watch_latency(store: Store, n: int) -> list[float]:
    events = store.watch("bench/w/", prefix_end("bench/w/"))
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.5)  # the watch is registered
    await store.put("bench/w/warm", b"x")
    await first
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await store.put(f"bench/w/{i % 10}", b"x" * 200)
        await anext(events)
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def measure(store: Store, n: int) -> Figures:
    for i in range(100):
        await store.put(f"bench/r/{i:03}", b"x" * 200)
    figures: Figures = {}
    figures["get one key"] = await timed(n, lambda i: store.get(f"bench/r/{i % 100:03}"))
    prefix = ("bench/r/", prefix_end("bench/r/"))
    figures["range of 100 keys"] = await timed(n, lambda i: store.range(*prefix))
    figures["put, one at a time"] = await timed(
        n, lambda i: store.put(f"bench/p/{i % 50}", b"x" * 200)
    )
    figures["put, 16 at once"] = await concurrent_writes(store, n)
    figures["watch: put to event"] = await watch_latency(store, n)
    return figures


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.99))]


def report(sqlite: Figures, etcd: Figures) -> None:
    head = f"{'':24} {'SQLite ms':>18} {'etcd x3 ms':>18} {'etcd/SQLite':>14}"
    print(head)
    print(f"{'':24} {'median':>8} {'p99':>9} {'median':>8} {'p99':>9} {'median':>6} {'p99':>7}")
    for what, s in sqlite.items():
        e = etcd[what]
        sm, sp, em, ep = statistics.median(s), p99(s), statistics.median(e), p99(e)
        print(f"{what:24} {sm:8.3f} {sp:9.3f} {em:8.3f} {ep:9.3f} {em / sm:6.1f} {ep / sp:7.1f}")
    for label, figures in (("SQLite", sqlite), ("etcd", etcd)):
        burst = figures["put, 16 at once"]
        rate = len(burst) / (sum(burst) / 1000 / 16)
        print(f"{label}: about {rate:.0f} writes/s with 16 in flight")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=500, help="operations per figure")
    parser.add_argument("--follower", action="store_true", help="talk to a follower")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        root = Path(tmp)
        sqlite = await SqliteStore.open(root / "state.db")
        try:
            sqlite_figures = await measure(sqlite, args.n)
        finally:
            await sqlite.close()
        with local_etcd.cluster(root / "etcd", 3, election_ms=1000) as members:
            etcd_figures, role = await on_etcd(members, args.follower, args.n)
    print(f"{args.n} operations each; etcd: 3 members on loopback, TLS, client on the {role}")
    report(sqlite_figures, etcd_figures)


async def on_etcd(members: list[local_etcd.Member], follower: bool, n: int) -> tuple[Figures, str]:
    stores = [
        await EtcdStore.open(
            m.endpoint, ca_file=m.ca_file, cert_file=m.cert_file, key_file=m.key_file
        )
        for m in members
    ]
    try:
        leads = [await s.is_leader() for s in stores]
        pick = leads.index(not follower)
        for i, s in enumerate(stores):
            if i != pick:
                await s.close()
        return await measure(stores[pick], n), "follower" if follower else "leader"
    finally:
        for s in stores:
            await s.close()


if __name__ == "__main__":
    asyncio.run(main())
