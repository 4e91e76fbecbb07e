"""Big bodies on /v1: an upload refused (wrong key, unknown model, rate) before its file is read,
`Expect: 100-continue` answered 100 only for a body that will be read, and a flood of uploads
held within its bound in memory while other keys' chats are answered."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import uvloop
from aiohttp import BodyPartReader, web
from aiohttp.test_utils import TestServer

from llmgwd.catalog import ApiKey, KeyLimits, Model
from llmgwd.router import Balancer, Router, transcriptions
from llmgwd.router.metering import Meter
from tests.llmgwd.router.test_router_v1 import ENGINE_KEY, MODEL, FakePool, endpoint

KEY, OTHER = "sk-llmgw-audio-0123456789abcdef", "sk-llmgw-chats-0123456789abcdef"
LIMIT = transcriptions.MAX_AUDIO_BYTES  # the form's bound
BIG = 20 * 1024 * 1024  # a declared upload no refused request should ever have to send
MAX_BODY = 64 * 1024
ANSWER = {"text": "Hello there.", "usage": {"type": "tokens", "input_tokens": 3,
                                            "output_tokens": 2, "total_tokens": 5}}  # fmt: skip
CHAT = {"id": "x-1", "object": "chat.completion", "created": 1, "model": MODEL,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}  # fmt: skip


@dataclass
class Engine:
    """Reads each upload through without keeping it (its size and digest noted); answers
    chats at once and transcriptions once `go` is set."""

    got: list[tuple[int, str, str]] = field(default_factory=list)  # file size, sha256, model
    go: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Queue[None] = field(default_factory=asyncio.Queue)

    async def holding(self, n: int) -> None:
        """Until n uploads came whole (and are held)."""
        for _ in range(n):
            await self.arrived.get()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/audio/transcriptions", self._audio)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _audio(self, request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == f"Bearer {ENGINE_KEY}"
        size, digest, model = 0, hashlib.sha256(), ""
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            assert isinstance(part, BodyPartReader)
            if part.name != "file":
                model = (await part.text()) if part.name == "model" else model
                continue
            while chunk := await part.read_chunk(65536):
                size += len(chunk)
                digest.update(chunk)
        self.got.append((size, digest.hexdigest(), model))
        self.arrived.put_nowait(None)
        await self.go.wait()
        return web.json_response(ANSWER)

    async def _chat(self, request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(CHAT)


class Keys:
    """Two keys: the uploader's, whose limits a test sets, and another's."""

    def __init__(self) -> None:
        self.audio = ApiKey(id="key-audio", name="a", hash="", prefix="sk-llmgw-a")
        self.other = ApiKey(id="key-other", name="o", hash="", prefix="sk-llmgw-o")

    def authenticate(self, secret: str) -> ApiKey | None:
        return {KEY: self.audio, OTHER: self.other}.get(secret)


class Models:
    def __init__(self) -> None:
        self.models = {MODEL: Model(name=MODEL, source="file:/w.gguf")}

    def get(self, name: str) -> Model | None:
        return self.models.get(name)

    def all(self) -> list[Model]:
        return list(self.models.values())


@dataclass
class Site:
    host: str
    port: int
    engine: Engine
    keys: Keys
    uploads: transcriptions.Uploads


@contextlib.asynccontextmanager
async def site(most: int = 16, wait_s: float = 30.0) -> AsyncIterator[Site]:
    engine = Engine()
    server = TestServer(engine.app(), host="127.0.0.1")
    await server.start_server()
    pool = FakePool({MODEL: [endpoint(str(server.make_url("")).rstrip("/"))]}, {MODEL: 1})
    keys, uploads = Keys(), transcriptions.Uploads(most, wait_s)
    router = Router(keys, Models(), pool, meter=Meter(), balancer=Balancer(pool, slots=64),
                    max_body_bytes=MAX_BODY, max_audio_bytes=LIMIT, uploads=uploads)  # fmt: skip
    root = web.Application()
    root.add_subapp("/v1", router.app)
    # A refused upload's unsent rest is read and dropped for lingering_time (aiohttp's 10 s)
    # before its connection closes: 1 s here, for the tests' shutdowns.
    runner = web.AppRunner(root, lingering_time=1.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Site("127.0.0.1", runner.addresses[0][1], engine, keys, uploads)
    finally:
        engine.go.set()
        await runner.cleanup()
        await server.close()


# A client of raw bytes: what it sent, and when, is the test's to say.

BOUNDARY = "b0undary"


def text_part(name: str, value: str) -> bytes:
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
    return head.encode() + value.encode() + b"\r\n"


FILE_HEAD = (
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
    "Content-Type: audio/wav\r\n\r\n"
).encode()
END = f"\r\n--{BOUNDARY}--\r\n".encode()


def head(
    path: str, key: str, length: int, *, expect: bool = False, multipart: bool = True
) -> bytes:
    kind = f"multipart/form-data; boundary={BOUNDARY}" if multipart else "application/json"
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Authorization: Bearer {key}",
             f"Content-Type: {kind}", f"Content-Length: {length}"]  # fmt: skip
    if expect:
        lines.append("Expect: 100-continue")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]
    interim: list[int]  # the 1xx answers that came before


async def answer(reader: asyncio.StreamReader) -> Answer:
    """The next whole answer (a 100 Continue before it noted)."""
    interim: list[int] = []
    while True:
        status = int((await asyncio.wait_for(reader.readline(), 30)).split()[1])
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        if status >= 200:
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            return Answer(status, headers, json.loads(body) if body else {}, interim)
        interim.append(status)


async def upload(s: Site, size: int, *, key: str = KEY, model: str = MODEL) -> Answer:
    """A whole transcription of size bytes of audio (one shared buffer, sent in slices, so
    the client holds nothing of its own), the model part first as openai's client sends it."""
    audio = memoryview(AUDIO)[:size]
    before = text_part("model", model) + FILE_HEAD
    reader, writer = await asyncio.open_connection(s.host, s.port)
    try:
        path = "/v1/audio/transcriptions"
        writer.write(head(path, key, len(before) + size + len(END)) + before)
        for at in range(0, size, 65536):
            writer.write(audio[at : at + 65536])
            await writer.drain()
        writer.write(END)
        return await answer(reader)
    finally:
        writer.close()


AUDIO = bytes(range(256)) * (8 * 1024 * 1024 // 256)


async def refused_before_the_file(s: Site, key: str, model: str) -> Answer:
    """Send the head of a 20 MB upload, its model part and the file's first 256 KiB only,
    then wait for the answer: a server that reads the whole file first never answers this."""
    reader, writer = await asyncio.open_connection(s.host, s.port)
    try:
        before = text_part("model", model) + FILE_HEAD
        writer.write(head("/v1/audio/transcriptions", key, len(before) + BIG) + before)
        writer.write(AUDIO[: 256 * 1024])
        await writer.drain()
        return await answer(reader)
    finally:
        writer.close()


async def test_an_unknown_model_or_a_limited_key_is_refused_before_the_file_is_read() -> None:
    async with site() as s:
        unknown = await refused_before_the_file(s, KEY, "whisper-nope")
        s.keys.audio = msgspec.structs.replace(s.keys.audio, limits=KeyLimits(rpm=1))
        s.engine.go.set()
        first = await upload(s, 1000)
        limited = await refused_before_the_file(s, KEY, MODEL)
    assert (unknown.status, unknown.body["error"]["code"]) == (404, "model_not_found")
    assert first.status == 200
    assert limited.status == 429 and limited.body["error"]["type"] == "requests"
    assert "retry-after" in limited.headers
    assert [got[0] for got in s.engine.got] == [1000]  # only the first came


async def test_expect_100_continue_only_for_a_body_that_will_be_read() -> None:
    over = LIMIT + 1
    async with site() as s:
        s.engine.go.set()
        asks = [
            head("/v1/audio/transcriptions", KEY, over, expect=True),  # over the form's limit
            head("/v1/audio/transcriptions", "sk-wrong", BIG, expect=True),  # a wrong key
            head("/v1/chat/completions", KEY, MAX_BODY + 1, expect=True, multipart=False),
            head("/v1/messages", "sk-wrong", 100, expect=True, multipart=False),
        ]
        refusals = []
        for ask in asks:  # each on a connection of its own: a refused one is closed
            reader, writer = await asyncio.open_connection(s.host, s.port)
            writer.write(ask)
            refusals.append(await answer(reader))
            writer.close()
        reader, writer = await asyncio.open_connection(s.host, s.port)
        form = text_part("model", MODEL) + FILE_HEAD + AUDIO[:1000] + END
        writer.write(head("/v1/audio/transcriptions", KEY, len(form), expect=True))
        status = int((await asyncio.wait_for(reader.readline(), 30)).split()[1])
        await reader.readline()
        writer.write(form)
        accepted = await answer(reader)
        writer.close()
    assert [(a.status, a.interim) for a in refusals] == [(413, []), (401, []), (413, []),
                                                         (401, [])]  # fmt: skip
    assert all(a.headers.get("connection") == "close" for a in refusals)
    assert refusals[0].body["error"]["code"] == "request_too_large"
    assert refusals[3].body["type"] == "error"  # Anthropic's shape on its route
    assert (status, accepted.status) == (100, 200)


def test_a_flood_of_uploads_holds_its_memory_bound_and_chats_still_answer() -> None:
    """8 uploads of 6 MiB at once, all held by the engine until another key's chat is answered:
    what Python allocates meanwhile stays within the spools' share in memory (run on uvloop,
    as llmgwd is: its transport sends the spool's mapped file without copying it)."""
    n, size = 8, 6 * 1024 * 1024

    async def flood() -> tuple[int, list[Answer], list[tuple[int, str, str]], int]:
        async with site() as s:
            tracemalloc.start()
            try:
                floods = [asyncio.create_task(upload(s, size)) for _ in range(n)]
                await s.engine.holding(n)  # every upload spooled and sent, held by the engine
                chat = await chat_of(s, OTHER)
                s.engine.go.set()
                answers = await asyncio.gather(*floods)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            return chat, answers, s.engine.got, peak

    chat, answers, got, peak = uvloop.run(flood())
    assert chat == 200 and [a.status for a in answers] == [200] * n
    assert got == [(size, hashlib.sha256(AUDIO[:size]).hexdigest(), MODEL)] * n
    bound = n * 2 * transcriptions.SPOOL_MEMORY_BYTES + 4 * 1024 * 1024
    assert peak < bound, f"peak {peak / 2**20:.1f} MiB over {bound / 2**20:.1f} MiB"


async def chat_of(s: Site, key: str) -> int:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    reader, writer = await asyncio.open_connection(s.host, s.port)
    try:
        writer.write(head("/v1/chat/completions", key, len(body), multipart=False) + body)
        return (await answer(reader)).status
    finally:
        writer.close()


async def test_uploads_over_the_spools_wait_then_get_a_503_in_openais_shape() -> None:
    async with site(most=2, wait_s=0.2) as s:
        held = [asyncio.create_task(upload(s, 2 * 1024 * 1024)) for _ in range(2)]
        await s.engine.holding(2)  # both spools taken until the engine answers
        busy = await upload(s, 1000)
        s.engine.go.set()
        answers = await asyncio.gather(*held)
        after = await upload(s, 1000)
    assert busy.status == 503 and busy.body["error"]["code"] == "uploads_busy"
    assert busy.headers["retry-after"] == "5"
    assert [a.status for a in answers] == [200, 200] and after.status == 200
