"""bench/router/cpu_per_request.py: the router's CPU per /v1 request, in one process, counted
rather than timed against the clock, so that a busy machine moves it little.

The real stack as llmgwd builds it (listener.serve: its connection protocol, CORS hook and
error middleware; the Router with its error and metrics middlewares, a Meter, a key with
rpm/tpm limits and budgets, prefix-aware balancing over two replicas; the access line
formatted by llmgw.log's stderr handler, written to /dev/null) runs in this process on uvloop;
the mock engine (router/mock.py) runs in a child process. A bare client (prebuilt request
bytes on raw asyncio connections) sends N requests one after another and N over C
connections at once: non-streamed chats and streamed ones (the mock's chunks sent at once).
The same client against the mock directly gives the client's own share, which is taken off.

Prints, for each case: process CPU microseconds a request, the router's share (through the
router less direct), the best of --rounds rounds; and Python function calls a request
(cProfile's count, client included: it is a few calls), of them in llmgw's code.

`--metrics-both`: two routers in the run, request metrics on and off; `--levels-both`: the
key with its own limits only, and the same key as a user's in a project of a team of an
organization, each of the five levels with rpm, tpm, token and spend budgets that never refuse
(five_levels.py); their CPU and calls ratios.

    PYTHONPATH=TREE/llmgwd/src:TREE/src .venv/bin/python bench/router/cpu_per_request.py
        [--n 2000] [--rounds 5] [--concurrency 16] [--chunks 16] [--metrics-both|--levels-both]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import io
import os
import pstats
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry

from llmgw import log as llmgw_log
from llmgw.config import ClientPort
from llmgwd.catalog import ApiKey, KeyLimits, Model
from llmgwd.clientport import listener
from llmgwd.nodes.pool import Endpoint
from llmgwd.router import Router
from llmgwd.router.metering import Meter

HERE = Path(__file__).resolve().parent
MODEL = "bench"
SECRET = "llmgw-bench-secret"
HUGE = 10**12
CHAT = (
    b'{"model":"bench","messages":[{"role":"system","content":"You are terse."},'
    b'{"role":"user","content":"Say hello in one word, please."}],"max_tokens":64%s}'
)


class Keys:
    """One key, found by its secret's hash as the catalog finds it (a user's key only while
    its user is active)."""

    def __init__(self, key: ApiKey) -> None:
        self._by_hash = {key.hash: key}
        self._active = {key.user} - {""}

    def authenticate(self, secret: str) -> ApiKey | None:
        key = self._by_hash.get(hashlib.sha256(secret.encode()).hexdigest())
        if key is None or (key.user and key.user not in self._active):
            return None
        return key


def key_and_meter(five_levels: bool) -> tuple[ApiKey, Meter]:
    """The bench's key, limits and budgets that never refuse, and its Meter; with five_levels,
    the key is a user's in a project of a team of an organization, each level so limited."""
    limits = KeyLimits(rpm=HUGE, tpm=HUGE, budget_tokens=HUGE, budget_spend=10**6,
                       budget_spend_per="month")  # fmt: skip
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    key = ApiKey(id="k1", name="bench", hash=digest, prefix="llmgw", limits=limits)
    if not five_levels:
        return key, Meter()
    # Imported here, so that trees from before levels can still be measured without them;
    # the repository's root first, where bench is a package (this folder's bench.py is not).
    sys.path.insert(0, str(HERE.parents[1]))
    from bench.router.five_levels import levels_of_five, owned

    key, meter = owned(key), Meter(levels=levels_of_five())
    assert len(meter.levels_of(key, Models.model)) == 5, "the key is not held to five levels"
    return key, meter


class Models:
    model = Model(name=MODEL, source="file:/m.gguf", price_prompt=1.0, price_completion=2.0)

    def get(self, name: str) -> Model | None:
        return self.model if name == MODEL else None

    def all(self) -> list[Model]:
        return [self.model]


@dataclass
class Pool:
    endpoints: list[Endpoint]

    def ready(self, model: str) -> list[Endpoint]:
        return self.endpoints if model == MODEL else []

    def wanted(self, model: str) -> int:
        return len(self.endpoints)


def request_bytes(port: int, stream: bool) -> bytes:
    body = CHAT % (b',"stream":true' if stream else b"")
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {SECRET}\r\nContent-Type: application/json\r\n"
        f"User-Agent: bench\r\nAccept: */*\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Conn(asyncio.Protocol):
    """A keep-alive connection that sends one request at a time and waits for its answer's
    end (by Content-Length, or a chunked body's last chunk)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._done: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        if end < 0 or self._done is None:
            return
        head = bytes(self._buf[:end]).lower()
        at = head.find(b"content-length:")
        if at >= 0:
            length = int(head[at + 15 : head.find(b"\r\n", at) % (len(head) + 1)].strip() or 0)
            if len(self._buf) < end + 4 + length:
                return
        elif not self._buf.endswith(b"0\r\n\r\n"):
            return
        status = int(head[9:12])
        self._buf.clear()
        self._done.set_result(status)

    async def ask(self, raw: bytes) -> int:
        assert self.transport is not None
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self._done


async def connect(port: int, n: int) -> list[Conn]:
    loop = asyncio.get_running_loop()
    conns = []
    for _ in range(n):
        _, conn = await loop.create_connection(Conn, "127.0.0.1", port)
        conns.append(conn)
    return conns


async def drive(conns: list[Conn], raw: bytes, n: int) -> None:
    """n requests over conns, each connection one at a time; every answer must be a 200."""

    async def one(conn: Conn, k: int) -> None:
        for _ in range(k):
            status = await conn.ask(raw)
            if status != 200:
                raise SystemExit(f"answer {status}")

    per = n // len(conns)
    await asyncio.gather(*(one(c, per) for c in conns))


Run = Callable[[], Awaitable[None]]


async def cpu_us(runs: list[Run], n: int, rounds: int) -> list[float]:
    """Each run's best round in process CPU microseconds a request, the runs taken in turn
    round by round, in ABBA order (so a machine getting busier weighs on each alike)."""
    best = [float("inf")] * len(runs)
    for r in range(rounds):
        order = list(range(len(runs)))
        for i in order if r % 2 == 0 else order[::-1]:
            start = time.process_time()
            await runs[i]()
            best[i] = min(best[i], (time.process_time() - start) / n * 1e6)
    return best


async def calls(run: Run, n: int) -> tuple[float, float]:
    """Python function calls a request (all, and in llmgw's code), cProfile's count."""
    prof = cProfile.Profile()
    prof.enable()
    await run()
    prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    ours = sum(
        v[1]
        for k, v in stats.stats.items()
        if "/llmgwd/" in k[0] or "/llmgw/" in k[0]  # type: ignore[attr-defined]
    )
    return stats.total_calls / n, ours / n  # type: ignore[attr-defined]


async def router_port(
    mock_port: int,
    prefix_balancing: bool = True,
    request_metrics: bool = True,
    five_levels: bool = False,
) -> tuple[web.AppRunner, int]:
    """llmgwd's client port, built as daemon._serve_client builds it, on a free port."""
    url = f"http://127.0.0.1:{mock_port}"
    endpoints = [Endpoint(f"r{i}", MODEL, "n1", url, "engine-key", slots=64, context=4096)
                 for i in (1, 2)]  # fmt: skip
    settings = ClientPort(listen="127.0.0.1:0", prefix_balancing=prefix_balancing,
                          request_metrics=request_metrics)  # fmt: skip
    key, meter = key_and_meter(five_levels)
    router = Router(Keys(key), Models(), Pool(endpoints), meter=meter,
                    prefix_aware=settings.prefix_balancing, registry=CollectorRegistry(),
                    count=settings.request_metrics)  # fmt: skip
    app = web.Application(client_max_size=settings.max_body_bytes)
    app.add_subapp("/v1", router.app)
    runner = await listener.serve(app, settings, "127.0.0.1", 0)
    port = runner.addresses[0][1]
    return runner, int(port)


def start_mock(chunks: int) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "mock.py"), "--port", "0", "--chunks", str(chunks),
         "--gap-ms", "0"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("PORT "):
        raise SystemExit(f"mock: {line!r}")
    return proc, int(line.split()[1])


def _runner(conns: list[Conn], raw: bytes, n: int) -> Run:
    async def run() -> None:
        await drive(conns, raw, n)

    return run


async def one_case(ports: list[int], mock_port: int, stream: bool, width: int, n: int,
                   rounds: int) -> str:  # fmt: skip
    """One case's line: CPU a request through each router port and direct (the client's own
    share, taken off), and Python calls a request through each."""
    conns = [await connect(port, width) for port in [*ports, mock_port]]
    runs = [_runner(c, request_bytes(port, stream), n)
            for c, port in zip(conns, [*ports, mock_port], strict=True)]  # fmt: skip
    for run in runs[:-1]:
        await run()  # warm: pooled connections, bound metric children
    *totals, own = await cpu_us(runs, n, rounds)
    counted = [await calls(run, n) for run in runs[:-1]]
    for c in [c for group in conns for c in group]:
        assert c.transport is not None
        c.transport.close()
    name = ("stream" if stream else "chat") + (
        " sequential" if width == 1 else f" concurrent x{width}")  # fmt: skip
    line = f"{name:28} {totals[0]:10.0f} {own:7.0f} {totals[0] - own:7.0f} " \
        f"{counted[0][0]:9.0f} {counted[0][1]:8.0f}"  # fmt: skip
    if len(ports) == 2:  # metrics on, then off; or five levels, then the key's own only
        a, b = totals[0] - own, totals[1] - own
        ratio = counted[0][0] / counted[1][0]
        line += f" {b:7.0f} {counted[1][0]:9.0f} {a / b:6.3f} {ratio:6.3f}"
    return line


async def bench(args: argparse.Namespace, mock_port: int) -> None:
    metrics, five = [not args.metrics_off], [False]  # a router for each (metrics, five)
    if args.metrics_both:
        metrics = [True, False]
    if args.levels_both:
        five = [True, False]
    runners = [await router_port(mock_port, not args.prefix_off, on, f)
               for on in metrics for f in five]  # fmt: skip
    ports = [port for _, port in runners]
    n, rounds = args.n, args.rounds
    where = Path(listener.__file__).parents[2]
    print(f"n={n} a case, best of {rounds} rounds; concurrent: {args.concurrency} connections; "
          f"streams of {args.chunks} chunks; llmgwd from {where}")  # fmt: skip
    head = f"{'case':28} {'CPU us/req':>10} {'direct':>7} {'router':>7} {'calls/req':>9} " \
        f"{'in llmgw':>8}"  # fmt: skip
    if args.metrics_both:
        head += f" {'off':>7} {'calls off':>9} {'on/off':>6} {'calls':>6}"
        print("metrics on (router, calls/req) and off (off, calls off), the same run, ABBA")
    if args.levels_both:
        head += f" {'key':>7} {'calls key':>9} {'5/key':>6} {'calls':>6}"
        print("five levels (router, calls/req) and the key's own only (key, calls key), "
              "the same run, ABBA")  # fmt: skip
    print(head)
    try:
        for stream in (False, True):
            for width in (1, args.concurrency):
                print(await one_case(ports, mock_port, stream, width, n, rounds), flush=True)
    finally:
        for runner, _ in runners:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--prefix-off", action="store_true", help="client.prefix_balancing off")
    parser.add_argument("--metrics-off", action="store_true", help="client.request_metrics off")
    both = "two routers in the run, metrics on and off, and their ratio"
    pair = parser.add_mutually_exclusive_group()
    pair.add_argument("--metrics-both", action="store_true", help=both)
    five = "two routers in the run, a key in five levels of limits and the key alone, and the ratio"
    pair.add_argument("--levels-both", action="store_true", help=five)
    parser.add_argument("--no-access-line", action="store_true", help="log level warning")
    args = parser.parse_args()
    stderr = sys.stderr
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the access lines go there)
    llmgw_log.setup("llmgwd", "warning" if args.no_access_line else "info")
    sys.stderr = stderr
    proc, mock_port = start_mock(args.chunks)
    try:
        uvloop.run(bench(args, mock_port))
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
