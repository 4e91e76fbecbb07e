"""Time to first token of a streamed chat: through llmgwd against the same engine used directly.

Needs a running cluster (scripts/quickstart). The direct side is the very engine the
router sends to: its port from `llmgw nodes --json`, its key derived from the cluster
secret (as root, read from the quickstart's overlay), so only llmgwd's part differs.
Requests alternate between the two so both see the same machine. With --own-engine it
starts a second llama-server of the same binary and model instead. Prints figures; never
passes or fails.

    .venv/bin/python bench/first_token.py [--n 20] [--own-engine]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
QS = Path("/var/lib/llmgw-quickstart")
BODY = {
    "model": "smollm2",
    "messages": [{"role": "user", "content": "Say hello in five words."}],
    "max_tokens": 16,
    "stream": True,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def ttft(session: aiohttp.ClientSession, url: str, key: str) -> float:
    """Seconds from sending the request to the first content chunk."""
    t0 = time.perf_counter()
    async with session.post(url, json=BODY, headers={"Authorization": f"Bearer {key}"}) as r:
        r.raise_for_status()
        first = 0.0
        async for line in r.content:
            if not first and line.startswith(b"data: ") and b'"content"' in line:
                first = time.perf_counter() - t0
        return first


async def wait_health(url: str) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(300):
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise SystemExit(f"{url} never became healthy")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def measure(n: int, gateway: str, key: str, port: int, direct_key: str) -> None:
    """Alternate streamed chats between the engine and llmgwd; print the figures."""
    await wait_health(f"http://127.0.0.1:{port}/health")
    direct_url = f"http://127.0.0.1:{port}/v1/chat/completions"
    gw_url = f"{gateway}/v1/chat/completions"
    d: list[float] = []
    g: list[float] = []
    async with aiohttp.ClientSession() as s:
        await ttft(s, direct_url, direct_key)  # warm both
        await ttft(s, gw_url, key)
        for _ in range(n):
            d.append(await ttft(s, direct_url, direct_key))
            g.append(await ttft(s, gw_url, key))
    print(f"first token, {n} streamed chats each, SmolLM2-135M on this machine's CPU")
    for name, xs in (("direct to llama-server", d), ("through llmgwd", g)):
        print(
            f"  {name:24s} p50 {statistics.median(xs) * 1000:7.1f} ms"
            f"   p90 {pct(xs, 90) * 1000:7.1f} ms"
        )
    added = [b - a for a, b in zip(d, g, strict=True)]
    print(
        f"  {'added by llmgwd':24s} p50 {statistics.median(added) * 1000:7.1f} ms"
        f"   ratio p50 {statistics.median(g) / statistics.median(d):.2f}x"
    )


def cluster_engine() -> tuple[int, str]:
    """The quickstart engine's port and key (the router's own way of deriving it)."""
    from llmgwd.catalog import engine_key

    pid = (QS / "pid").read_text().strip()
    inside = ["nsenter", "-t", pid, "-a", "-r", "-w", "--"]
    nodes = subprocess.run(
        [*inside, str(ROOT / ".venv/bin/llmgw"), "nodes", "--json"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    replica = next(r for n in json.loads(nodes.stdout) for r in n["replicas"] if r["port"])
    secret = (QS / "upper/var/lib/llmgw/secret").read_bytes()
    return int(replica["port"]), engine_key(secret, replica["id"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--gateway", default="http://127.0.0.1:7700")
    ap.add_argument("--own-engine", action="store_true", help="direct: a llama-server of its own")
    args = ap.parse_args()
    key = (QS / "key").read_text().strip()
    if not args.own_engine:
        port, engine_key = cluster_engine()
        asyncio.run(measure(args.n, args.gateway, key, port, engine_key))
        return
    build = subprocess.run(
        [ROOT / "scripts/build-llama-server"], check=True, capture_output=True, text=True
    )
    sys.path.insert(0, str(ROOT))
    from integration.llmgw_node import gguf

    model = gguf()
    port = free_port()
    direct_key = "bench-" + os.urandom(8).hex()
    argv = [build.stdout.strip(), "--model", str(model), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--api-key", direct_key, "--alias", "smollm2"]
    engine = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        asyncio.run(measure(args.n, args.gateway, key, port, direct_key))
    finally:
        engine.terminate()
        engine.wait(10)


if __name__ == "__main__":
    main()
