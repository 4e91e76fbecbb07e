"""The CPU a request of the router's engine client against aiohttp's, in one process.

Both POST the router's own request (its headers, a small chat body) to bench/router's mock
engine in a child process, one request after another on one kept-alive connection, and read
the whole answer; or read a stream of SSE chunks. The figure is process CPU a request (best of
rounds, the clients taken in ABBA order), so the mock's own work is not counted.

    .venv/bin/python bench/router/engine_client.py [--n 3000 --rounds 5 --chunks 16]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import uvloop

from llmgwd.router.engine_client import EngineClient

MOCK = Path(__file__).with_name("mock.py")
HEADERS = {
    "Authorization": "Bearer sk-engine-0123456789abcdef",
    "Content-Type": "application/json",
    "Accept": "application/json",
    "x-request-id": "0123456789abcdef01234567",
    "Accept-Encoding": "identity",
    "User-Agent": "llmgw",
}
CHAT = b'{"model":"bench","messages":[{"role":"user","content":"Say hi."}],"max_tokens":8}'
STREAM = CHAT[:-1] + b',"stream":true}'

Run = Callable[[], Awaitable[None]]


def with_aiohttp(session: aiohttp.ClientSession, base: str, body: bytes, n: int) -> Run:
    url = f"{base}/v1/chat/completions"

    async def run() -> None:
        for _ in range(n):
            async with session.post(url, data=body, headers=HEADERS) as r:
                while await r.content.readany():
                    pass

    return run


def with_ours(client: EngineClient, base: str, body: bytes, n: int) -> Run:
    async def run() -> None:
        for _ in range(n):
            answer = await client.post(base, "/v1/chat/completions", HEADERS, body)
            while await answer.readany():
                pass
            answer.close()

    return run


async def best_us(runs: list[Run], n: int, rounds: int) -> list[float]:
    """Each run's best round, in CPU microseconds a request, taken in ABBA order."""
    best = [float("inf")] * len(runs)
    for r in range(rounds):
        order = list(range(len(runs)))
        for i in order if r % 2 == 0 else order[::-1]:
            start = time.process_time()
            await runs[i]()
            best[i] = min(best[i], (time.process_time() - start) / n * 1e6)
    return best


async def bench(port: int, args: argparse.Namespace) -> None:
    base = f"http://127.0.0.1:{port}"
    client = EngineClient(connect_timeout_s=3.0, read_timeout_s=60.0)
    async with aiohttp.ClientSession() as session:
        print(f"{'':22} {'aiohttp us':>10} {'llmgw us':>10} {'ratio':>7}")
        for name, body, n in (("chat", CHAT, args.n), ("stream", STREAM, max(args.n // 10, 1))):
            runs = [with_aiohttp(session, base, body, n), with_ours(client, base, body, n)]
            await runs[0]()  # warm: the connections made, the code paths taken once
            await runs[1]()
            theirs, ours = await best_us(runs, n, args.rounds)
            label = name if name == "chat" else f"stream ({args.chunks} chunks)"
            print(f"{label:22} {theirs:10.1f} {ours:10.1f} {theirs / ours:7.2f}")
    await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=16)
    args = parser.parse_args()
    argv = [sys.executable, str(MOCK), "--port", "0", "--chunks", str(args.chunks), "--gap-ms", "0"]
    mock = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        assert mock.stdout is not None
        port = int(mock.stdout.readline().split()[1])
        uvloop.run(bench(port, args))
    finally:
        mock.kill()


if __name__ == "__main__":
    main()
