"""bench/cache_isolation: what one key learns of another's prompt by time (client.cache_isolation).

A real llama-server (SmolLM2-135M, one thread, 4 slots) behind the router in this process, run
as llmgwd would start it for each setting (org and key: `--cache-ram 0`, as the agent sets it;
none: llama-server's own prompt cache in RAM). Keys A and A2 of organization acme, B of globex.
Each round, on new prompts of about --words words:

  A      A sends prompt P (nothing cached)
  B on P B sends the same P: served from A's cache or not
  fresh  B sends a prompt of the same length nobody sent
  A2     A2 (A's organization) sends P with one more turn: the gain kept within it

Each request is a chat of max_tokens 1, timed whole; "cached" is the prompt tokens the engine
took from its cache for it (llama-server's /metrics prompt_tokens_cached_total, read before and
after). It prints figures only, never passes or fails on a time; the engine is stopped after.

    flock /tmp/llmgw-integration.lock .venv/bin/python bench/cache_isolation/bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.prefix.bench import (  # noqa: E402
    ENGINE_KEY,
    MODEL,
    WORDS,
    Models,
    Pool,
    cached_tokens,
    free_port,
    gguf,
    healthy,
)
from llmgw_agentd.engines import llamacpp  # noqa: E402
from llmgwd.catalog import ApiKey  # noqa: E402
from llmgwd.nodes.pool import Endpoint  # noqa: E402
from llmgwd.router import Router, isolation  # noqa: E402
from llmgwd.router.isolation import Mode  # noqa: E402

SLOTS = 4
KEYS = {"sk-llmgw-a": "acme", "sk-llmgw-a2": "acme", "sk-llmgw-b": "globex"}
A, A2, B = KEYS


class Keys:
    def authenticate(self, secret: str) -> ApiKey | None:
        org = KEYS.get(secret)
        if org is None:
            return None
        return ApiKey(id=f"key-{secret}", name=secret, hash="", prefix=secret, org=org)


def server() -> str:
    """scripts/build-llama-server's CPU build: where the agent looks first, else any."""
    found = [p for p in llamacpp.binary_candidates() if p.is_file()]
    found += sorted(Path.home().glob(".cache/llmgw/llama.cpp/*/llama-server"))
    if not found:
        sys.exit("no llama-server built: run scripts/build-llama-server --cpu")
    return str(found[0])


@asynccontextmanager
async def engine(extra: list[str]) -> AsyncIterator[str]:
    """One llama-server, one thread and SLOTS slots; stopped on the way out."""
    port = free_port()
    argv = [server(), "-m", str(gguf()), "--host", "127.0.0.1", "--port", str(port),
            "-c", str(4096 * SLOTS), "-np", str(SLOTS), "-t", "1", "--metrics",
            "--api-key", ENGINE_KEY, "--alias", MODEL, "--no-webui", "--no-repack",
            *extra]  # fmt: skip
    out = asyncio.subprocess.DEVNULL
    proc = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out)
    try:
        url = f"http://127.0.0.1:{port}"
        await healthy(url)
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


@asynccontextmanager
async def gateway(url: str, mode: Mode) -> AsyncIterator[str]:
    endpoint = Endpoint("r1", MODEL, "n1", url, ENGINE_KEY, slots=SLOTS, context=4096)
    router = Router(Keys(), Models(), Pool([endpoint]), cache_isolation=mode)
    root = web.Application()
    root.add_subapp("/v1", router.app)
    runner = web.AppRunner(root, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def prompt(rng: random.Random, words: int) -> list[dict[str, str]]:
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return [{"role": "system", "content": f"Notes {rng.random():.9f}: {text}"},
            {"role": "user", "content": "Summarise the notes."}]  # fmt: skip


async def timed(
    http: aiohttp.ClientSession, gw: str, engine: str, key: str, messages: list[dict[str, str]]
) -> tuple[float, int, int]:
    """One chat: its seconds, its prompt tokens, and those the engine took from its cache."""
    before = await cached_tokens([engine])
    body = {"model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0}
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {key}"}
    async with http.post(f"{gw}/v1/chat/completions", json=body, headers=headers) as r:
        answer = await r.json()
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {answer}")
    took = time.perf_counter() - started
    return took, answer["usage"]["prompt_tokens"], await cached_tokens([engine]) - before


async def run(mode: Mode, args: argparse.Namespace) -> None:
    extra = [] if mode == "none" else ["--cache-ram", "0"]
    rows: dict[str, list[tuple[float, int, int]]] = {"A": [], "B on P": [], "fresh": [], "A2": []}
    turn = [{"role": "assistant", "content": "Done."},
            {"role": "user", "content": "And the first word?"}]  # fmt: skip
    async with (
        engine(extra) as url,
        gateway(url, mode) as gw,
        aiohttp.ClientSession() as http,
    ):
        for i in range(args.rounds):
            rng = random.Random(i)
            p, fresh = prompt(rng, args.words), prompt(rng, args.words)
            rows["A"].append(await timed(http, gw, url, A, p))
            rows["B on P"].append(await timed(http, gw, url, B, p))
            rows["fresh"].append(await timed(http, gw, url, B, fresh))
            rows["A2"].append(await timed(http, gw, url, A2, p + turn))
    print(f"  cache_isolation {mode} (engine args {extra}):")
    for name, got in rows.items():
        secs = [t for t, _, _ in got]
        print(f"    {name:7} {statistics.median(secs):6.2f} s median "
              f"({', '.join(f'{t:.2f}' for t in secs)}), prompt {got[0][1]} tokens, "
              f"cached {', '.join(str(c) for _, _, c in got)}", flush=True)  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=1800, help="about 2.3k tokens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="org,none")
    args = parser.parse_args()
    print(f"bench/cache_isolation: 1 llama-server (SmolLM2-135M, -t 1, -np {SLOTS}, --no-repack), "
          f"{args.rounds} rounds of prompts of {args.words} words", flush=True)  # fmt: skip
    for mode in args.modes.split(","):
        await run(isolation.mode(mode), args)


if __name__ == "__main__":
    asyncio.run(main())
