"""The /v1 router end to end: the official openai client, a fake engine, a fake pool."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import socket
import struct
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd.catalog import ApiKey, Model, hash_secret
from llmgwd.nodes.pool import Endpoint
from llmgwd.router import Router

USER_SECRET = "sk-llmgw-user-0123456789abcdef"
REVOKED_SECRET = "sk-llmgw-revoked-0123456789abcdef"
ENGINE_KEY = "engine-key-fedcba9876543210"
MODEL = "smollm2"
IDLE_MODEL = "idle-model"  # in the catalog, no replica ready


# The fake engine: OpenAI-shaped answers, like llama-server's.


@dataclass
class Seen:
    """One request as the engine received it."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeEngine:
    """An OpenAI-shaped engine whose streams are N chunks spaced in time."""

    url: str = ""
    chunks: int = 4
    gap_s: float = 0.1
    hang_after_first: bool = False  # send one chunk, then nothing for a long time
    abort_after: int | None = None  # cut the connection after this many chunks
    cut_event: bytes = b""  # the start of one more event, sent just before the cut
    gate: asyncio.Event | None = None  # when set up, answers wait until it is set
    seen: list[Seen] = field(default_factory=list)
    finished_at: float | None = None
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    embeddings: bool = True  # served, as by llama-server with --embeddings; else its 501
    unavailable: int = 0  # answer this many requests 503 first, as llama-server loading
    in_flight: int = 0  # /v1 requests it is answering now
    most_in_flight: int = 0  # the most it ever answered at once

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._count])
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/embeddings", self._embed)
        app.router.add_get("/health", self._health)
        return app

    @web.middleware
    async def _count(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/health":
            return await handler(request)  # type: ignore[no-any-return]
        if self.unavailable:
            self.unavailable -= 1
            error = {"code": 503, "message": "Loading model", "type": "unavailable_error"}
            return web.json_response({"error": error}, status=503)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await handler(request)  # type: ignore[no-any-return]
        finally:
            self.in_flight -= 1

    async def _embed(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append(Seen(request.path, dict(request.headers), body))
        if request.headers.get("Authorization") != f"Bearer {ENGINE_KEY}":
            return web.json_response({"error": {"message": "bad engine key"}}, status=401)
        if not self.embeddings:  # llama-server's own words
            message = "This server does not support embeddings. Start it with `--embeddings`"
            error = {"code": 501, "message": message, "type": "not_supported_error"}
            return web.json_response({"error": error}, status=501)
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": _vector(i, body)}
                for i in range(len(texts))]  # fmt: skip
        tokens = EMBED_TOKENS * len(texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        answer = {"object": "list", "model": body["model"], "data": data, "usage": usage}
        return web.json_response(answer)

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(Seen(request.path, dict(request.headers), body))
        if request.headers.get("Authorization") != f"Bearer {ENGINE_KEY}":
            return web.json_response({"error": {"message": "bad engine key"}}, status=401)
        if body.get("max_tokens") == 4242:  # the engine's own refusal, in words of its own
            error = {"message": "context too long", "type": "invalid_request_error"}
            return web.json_response({"error": error}, status=400)
        chat = request.path.endswith("chat/completions")
        if self.gate is not None:
            await self.gate.wait()
        if body.get("stream"):
            usage = (body.get("stream_options") or {}).get("include_usage") is True
            return await self._stream(request, chat, body["model"], usage)
        return web.json_response(_answer(chat, body["model"]))

    async def _stream(
        self, request: web.Request, chat: bool, model: str, usage: bool = False
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(self.chunks):
                chunk = _chunk(chat, model, i)
                if usage and not chat and i == self.chunks - 1:  # as llama.cpp: on the last text
                    chunk["usage"] = _usage(self.chunks)
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                if self.abort_after == i + 1:
                    assert request.transport is not None
                    if self.cut_event:
                        await resp.write(self.cut_event)
                        await asyncio.sleep(0.05)  # so it reaches the router before the cut
                    request.transport.abort()
                    return resp
                await asyncio.sleep(30 if self.hang_after_first else self.gap_s)
            if usage and chat:  # as llama.cpp: a chunk of its own, without choices
                chunk = {**_chunk(chat, model, 0), "choices": [], "usage": _usage(self.chunks)}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            self.finished_at = time.monotonic()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return resp


EMBED_TOKENS = 3  # the prompt tokens of each input the fake engine embeds
EMBEDDING = [0.5, -1.0, 2.0]  # its vector for input i, after i itself


def _vector(i: int, body: dict[str, Any]) -> list[float] | str:
    values = [float(i), *EMBEDDING]
    if body.get("encoding_format") == "base64":  # what the openai client asks for by default
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
    return values


def _answer(chat: bool, model: str) -> dict[str, Any]:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    if chat:
        message = {"role": "assistant", "content": "hello from the engine"}
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "stop"}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": "engine text", "finish_reason": "stop", "logprobs": None}
        kind = "text_completion"
    return {"id": "x-1", "object": kind, "created": 1, "model": model, "choices": [choice],
            "usage": usage}  # fmt: skip


STREAM_PROMPT_TOKENS = 7  # the usage a stream ends with: these, and one token a chunk
# What a client that asked for a whole answer gets: the router asks the engine for a stream all
# the same and folds its chunks (router/folding.py).
FOLDED_TEXT = "t0 t1 t2 t3 "


def _usage(chunks: int) -> dict[str, int]:
    return {"prompt_tokens": STREAM_PROMPT_TOKENS, "completion_tokens": chunks,
            "total_tokens": STREAM_PROMPT_TOKENS + chunks}  # fmt: skip


def _chunk(chat: bool, model: str, i: int) -> dict[str, Any]:
    if chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": f"t{i} ", "finish_reason": None, "logprobs": None}
        kind = "text_completion"
    return {"id": "x-1", "object": kind, "created": 1, "model": model, "choices": [choice]}


# Fake Pool, Keys and Models.


@dataclass
class FakePool:
    endpoints: dict[str, list[Endpoint]] = field(default_factory=dict)
    wanted_replicas: dict[str, int] = field(default_factory=dict)

    def ready(self, model: str) -> list[Endpoint]:
        return list(self.endpoints.get(model, []))

    def wanted(self, model: str) -> int:
        return self.wanted_replicas.get(model, 0)


class FakeKeys:
    def __init__(self) -> None:
        self._by_hash = {
            hash_secret(USER_SECRET): ApiKey(id="key-user", name="u", hash="", prefix="sk-llmgw-u"),
            hash_secret(REVOKED_SECRET): ApiKey(
                id="key-old", name="o", hash="", prefix="sk-llmgw-r", revoked=True
            ),
        }

    def authenticate(self, secret: str) -> ApiKey | None:
        return self._by_hash.get(hash_secret(secret))


class FakeModels:
    def __init__(self, *names: str) -> None:
        self._models = {
            n: Model(name=n, source="file:/m.gguf", created_at=1700000000.5) for n in names
        }

    def get(self, name: str) -> Model | None:
        return self._models.get(name)

    def all(self) -> list[Model]:
        return list(self._models.values())

    def want(self, name: str, replicas: int) -> None:
        self._models[name] = msgspec.structs.replace(self._models[name], replicas=replicas)

    def set(self, model: Model) -> None:
        self._models[model.name] = model


def endpoint(url: str, replica: str = "r1") -> Endpoint:
    return Endpoint(replica_id=replica, model=MODEL, node="n1", url=url, api_key=ENGINE_KEY)


def dead_url() -> str:
    """A local port nobody listens on: connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@asynccontextmanager
async def serve(
    router: Router, *, handler_cancellation: bool = False, **root_options: Any
) -> AsyncIterator[str]:
    """The router mounted at /v1 on a real TCP site, as the daemon mounts it."""
    root = web.Application(**root_options)
    root.add_subapp("/v1", router.app)
    # aiohttp's default: handlers are not cancelled when their client leaves.
    runner = web.AppRunner(root, handler_cancellation=handler_cancellation)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@dataclass
class Gateway:
    url: str
    engine: FakeEngine
    pool: FakePool
    router: Router
    http: aiohttp.ClientSession
    models: FakeModels = field(default_factory=FakeModels)

    def openai(self, key: str = USER_SECRET) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=10)

    async def post(
        self, path: str, body: Any, *, key: str | None = USER_SECRET, raw: bytes | None = None
    ) -> tuple[int, dict[str, Any], aiohttp.ClientResponse]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.http.post(f"{self.url}{path}", data=data, headers=headers) as resp:
            return resp.status, await resp.json(), resp


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    fake = FakeEngine()
    server = TestServer(fake.app(), host="127.0.0.1")  # cancels handlers on disconnect
    await server.start_server()
    fake.url = str(server.make_url("")).rstrip("/")
    yield fake
    await server.close()


@pytest.fixture
async def gw(engine: FakeEngine, request: pytest.FixtureRequest) -> AsyncIterator[Gateway]:
    """The router in front of the fake engine; parametrize with True to cancel handlers."""
    pool = FakePool({MODEL: [endpoint(engine.url)]}, {MODEL: 1, IDLE_MODEL: 1})
    models = FakeModels(MODEL, IDLE_MODEL)
    router = Router(FakeKeys(), models, pool, max_body_bytes=64 * 1024)
    cancels = bool(getattr(request, "param", False))
    async with (
        serve(router, handler_cancellation=cancels) as url,
        aiohttp.ClientSession() as http,
    ):
        yield Gateway(url, engine, pool, router, http, models)


def assert_error_shape(body: dict[str, Any], code: str | None, param: str | None = None) -> None:
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] == code
    assert error["param"] == param


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


# Happy paths with the official client.


async def test_chat_goes_to_the_engine_with_its_key_not_the_clients(gw: Gateway) -> None:
    async with gw.openai() as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    answer = raw.parse()
    assert answer.choices[0].message.content == FOLDED_TEXT
    assert raw.headers["x-request-id"]
    (seen,) = gw.engine.seen
    assert seen.path == "/v1/chat/completions"
    assert seen.body["model"] == MODEL
    assert seen.headers["Authorization"] == f"Bearer {ENGINE_KEY}"
    assert not any(USER_SECRET in v for v in seen.headers.values())


async def test_completions(gw: Gateway) -> None:
    async with gw.openai() as client:
        answer = await client.completions.create(model=MODEL, prompt="Once", max_tokens=5)
    assert answer.choices[0].text == FOLDED_TEXT
    assert gw.engine.seen[0].path == "/v1/completions"
    assert gw.engine.seen[0].body["prompt"] == "Once"


async def test_stream_chunks_arrive_as_the_engine_sends_them(gw: Gateway) -> None:
    arrivals: list[float] = []
    text = ""
    async with gw.openai() as client:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        async for chunk in stream:
            arrivals.append(time.monotonic())
            text += chunk.choices[0].delta.content or ""
    assert text == "t0 t1 t2 t3 "
    assert gw.engine.finished_at is not None
    assert arrivals[0] < gw.engine.finished_at  # not buffered until the end
    assert arrivals[-1] - arrivals[0] > 2 * gw.engine.gap_s


async def test_completions_stream(gw: Gateway) -> None:
    async with gw.openai() as client:
        stream = await client.completions.create(model=MODEL, prompt="Once", stream=True)
        texts = [chunk.choices[0].text async for chunk in stream]
    assert texts == ["t0 ", "t1 ", "t2 ", "t3 "]


async def test_models_list_and_retrieve(gw: Gateway) -> None:
    async with gw.openai() as client:
        listed = await client.models.list()
        one = await client.models.retrieve(MODEL)
    assert sorted(m.id for m in listed.data) == sorted([MODEL, IDLE_MODEL])
    assert {(m.object, m.owned_by, m.created) for m in listed.data} == {
        ("model", "llmgw", 1700000000)
    }
    assert one.id == MODEL


async def test_routing_keys_in_the_body_are_ignored(gw: Gateway) -> None:
    async with gw.openai() as client:
        await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"api_base": dead_url(), "base_url": dead_url(), "url": dead_url()},
        )
    (seen,) = gw.engine.seen  # it reached the pool's engine
    assert not {"api_base", "base_url", "url"} & set(seen.body)


async def test_engine_refusal_is_told_in_the_routers_words(gw: Gateway) -> None:
    async with gw.openai() as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4242
            )
    assert caught.value.message.startswith("Error code: 400")
    assert "The model's engine refused the request." in caught.value.message
    assert "context too long" not in caught.value.message  # no engine wording (issue 26)


# Keys.


@pytest.mark.parametrize(
    ("header", "says"),
    [
        (None, "Missing"),
        ("Bearer sk-llmgw-nope-nope", "Incorrect"),
        (f"Bearer {REVOKED_SECRET}", "revoked"),
        (f"Basic {USER_SECRET}", "Malformed"),
    ],
)
async def test_bad_keys_get_401(gw: Gateway, header: str | None, says: str) -> None:
    headers = {"Authorization": header} if header else {}
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
        async with gw.http.request(method, f"{gw.url}{path}", json=CHAT, headers=headers) as r:
            body = await r.json()
            assert r.status == 401
        assert_error_shape(body, "invalid_api_key")
        assert body["error"]["type"] == "invalid_request_error"
        assert says in body["error"]["message"]
        assert USER_SECRET not in json.dumps(body) and REVOKED_SECRET not in json.dumps(body)
    assert not gw.engine.seen


async def test_openai_client_sees_authentication_error(gw: Gateway) -> None:
    async with gw.openai(key="sk-llmgw-wrong") as client:
        with pytest.raises(openai.AuthenticationError) as caught:
            await client.models.list()
    assert caught.value.code == "invalid_api_key"


# Bodies.


@pytest.mark.parametrize(
    ("path", "body", "param", "code"),
    [
        ("/v1/chat/completions", b"{not json", None, "invalid_json"),
        ("/v1/chat/completions", b"", None, "invalid_json"),
        ("/v1/chat/completions", b"[1, 2]", None, "invalid_json"),
        ("/v1/chat/completions", b"[" * 30000 + b"]" * 30000, None, "invalid_json"),
        (
            "/v1/chat/completions",
            {"messages": CHAT["messages"]},
            "model",
            "missing_required_parameter",
        ),
        ("/v1/chat/completions", {**CHAT, "model": 5}, "model", "invalid_type"),
        ("/v1/chat/completions", {"model": MODEL}, "messages", "missing_required_parameter"),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, "messages", "invalid_value"),
        ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, "messages", "invalid_type"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": ["hi"]},
            "messages[0]",
            "invalid_type",
        ),
        ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "stream", "invalid_type"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, "max_tokens", "invalid_value"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": "9"}, "max_tokens", "invalid_type"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": True}, "max_tokens", "invalid_type"),
        ("/v1/completions", {"model": MODEL}, "prompt", "missing_required_parameter"),
        ("/v1/completions", {"model": MODEL, "prompt": 3}, "prompt", "invalid_type"),
    ],
)
async def test_bad_bodies_get_400_naming_the_field(
    gw: Gateway, path: str, body: Any, param: str | None, code: str
) -> None:
    raw = body if isinstance(body, bytes) else None
    status, answer, _ = await gw.post(path, body, raw=raw)
    assert status == 400
    assert_error_shape(answer, code, param)
    assert not gw.engine.seen


async def test_openai_client_sees_bad_request(gw: Gateway) -> None:
    async with gw.openai() as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model=MODEL, messages=[])
    assert caught.value.param == "messages"


async def test_body_over_the_limit_gets_413(gw: Gateway) -> None:
    big = {**CHAT, "pad": "x" * 70_000}
    status, answer, _ = await gw.post("/v1/chat/completions", big)
    assert status == 413
    assert_error_shape(answer, "request_too_large")


async def test_chunked_body_over_the_limit_gets_413(gw: Gateway) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "smollm2", "pad": "'
        for _ in range(20):
            yield b"x" * 8192

    headers = {"Authorization": f"Bearer {USER_SECRET}"}
    url = f"{gw.url}/v1/chat/completions"
    async with gw.http.post(url, data=chunks(), headers=headers) as resp:
        assert resp.request_info.headers.get("Transfer-Encoding") == "chunked"
        assert resp.status == 413
        assert_error_shape(await resp.json(), "request_too_large")


async def test_client_max_size_refusal_is_in_openai_shape(engine: FakeEngine) -> None:
    router = Router(FakeKeys(), FakeModels(MODEL), FakePool())

    async def reads(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    router.app.router.add_post("/reads", reads)
    async with (
        serve(router, client_max_size=100) as url,
        aiohttp.ClientSession() as http,
        http.post(f"{url}/v1/reads", data=b"x" * 1000) as resp,
    ):
        assert resp.status == 413
        assert_error_shape(await resp.json(), "request_too_large")


# Models and replicas.


async def test_unknown_model_gets_404(gw: Gateway) -> None:
    async with gw.openai() as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}]
            )
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("no-such-model")
    assert caught.value.code == "model_not_found"


@pytest.mark.parametrize(("wanted", "says"), [(1, "is ready yet"), (0, "not being served")])
async def test_model_without_ready_replica_gets_503(gw: Gateway, wanted: int, says: str) -> None:
    gw.models.want(IDLE_MODEL, wanted)  # the catalog's count, not what reached a node
    status, body, resp = await gw.post("/v1/chat/completions", {**CHAT, "model": IDLE_MODEL})
    assert status == 503
    assert int(resp.headers["Retry-After"]) > 0
    assert_error_shape(body, "model_not_ready")
    assert says in body["error"]["message"]
    async with gw.openai() as client:
        with pytest.raises(openai.InternalServerError) as caught:
            await client.completions.create(model=IDLE_MODEL, prompt="x")
    assert caught.value.status_code == 503


async def test_unknown_route_and_wrong_method_in_openai_shape(gw: Gateway) -> None:
    async with gw.http.get(f"{gw.url}/v1/nope") as resp:
        assert resp.status == 404
        assert_error_shape(await resp.json(), "unknown_url")
        assert resp.headers["x-request-id"]
    async with gw.http.get(f"{gw.url}/v1/chat/completions") as resp:
        assert resp.status == 405
        assert resp.headers["Allow"] == "POST"
        assert_error_shape(await resp.json(), "method_not_allowed")


async def test_every_answer_has_its_own_request_id(gw: Gateway) -> None:
    ids = set()
    for body in (CHAT, {"model": 1}):
        _, _, resp = await gw.post("/v1/chat/completions", body)
        ids.add(resp.headers["x-request-id"])
    assert len(ids) == 2


# The proxy: retries, disconnects, broken streams.


@contextmanager
def busy(gw: Gateway, ep: Endpoint) -> Iterator[None]:
    """Make ep look busier than the others, so the balancer tries them first."""
    with gw.router.balancer.hold(ep):
        yield


async def test_refused_connection_goes_to_another_replica(gw: Gateway) -> None:
    live = endpoint(gw.engine.url, "live")
    gw.pool.endpoints[MODEL] = [endpoint(dead_url(), "dead"), live]
    with busy(gw, live):  # the dead one is tried first
        async with gw.openai() as client:
            answer = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}]
            )
    assert answer.choices[0].message.content == FOLDED_TEXT
    assert len(gw.engine.seen) == 1
    assert gw.router.balancer.outstanding("dead") == 0


async def test_no_reachable_replica_gets_503(gw: Gateway) -> None:
    gw.pool.endpoints[MODEL] = [endpoint(dead_url(), "a"), endpoint(dead_url(), "b")]
    status, body, resp = await gw.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 503
    assert "Retry-After" in resp.headers
    assert_error_shape(body, "model_not_ready")


@pytest.mark.parametrize("gw", [False, True], ids=["aiohttp-default", "handler-cancellation"],
                         indirect=True)  # fmt: skip
async def test_client_leaving_mid_stream_cancels_the_engine_request(gw: Gateway) -> None:
    gw.engine.hang_after_first = True
    headers = {"Authorization": f"Bearer {USER_SECRET}"}
    url = f"{gw.url}/v1/chat/completions"
    resp = await gw.http.post(url, json={**CHAT, "stream": True}, headers=headers)
    assert b"t0" in await resp.content.readany()
    assert gw.router.balancer.outstanding("r1") == 1
    resp.close()  # the client goes away while the engine is still generating
    await asyncio.wait_for(gw.engine.cancelled.wait(), timeout=2)
    for _ in range(20):
        if gw.router.balancer.outstanding("r1") == 0:
            break
        await asyncio.sleep(0.05)
    assert gw.router.balancer.outstanding("r1") == 0


@pytest.mark.parametrize("cut_event", [b"", b'data: {"id": "x-1", "obj'])
async def test_engine_breaking_mid_stream_ends_with_an_error_event(
    gw: Gateway, cut_event: bytes
) -> None:
    gw.engine.abort_after = 2
    gw.engine.cut_event = cut_event  # a half-sent event is dropped, not mixed with the error
    texts: list[str] = []
    async with gw.openai() as client:
        stream = await client.completions.create(model=MODEL, prompt="x", stream=True)
        with pytest.raises(openai.APIError) as caught:
            async for chunk in stream:
                texts.append(chunk.choices[0].text)
    assert texts == ["t0 ", "t1 "]
    assert "engine failed" in caught.value.message


# A node lost with requests in flight (cut off: no reset comes back, so only llmgwd can end them).


@asynccontextmanager
async def running(fake: FakeEngine) -> AsyncIterator[FakeEngine]:
    """A fake engine on a port of its own (several in one test: not the engine fixture)."""
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    fake.url = str(server.make_url("")).rstrip("/")
    try:
        yield fake
    finally:
        await server.close()


def on_node(ep: Endpoint, node: str) -> Endpoint:
    return dataclasses.replace(ep, node=node)


async def until(check: Any) -> None:
    async with asyncio.timeout(5):
        while not check():  # noqa: ASYNC110 (the engine's state has no event to wait on)
            await asyncio.sleep(0.01)


async def test_a_request_in_flight_on_a_lost_node_is_answered_by_another_replica(
    gw: Gateway,
) -> None:
    silent_engine = FakeEngine(gate=asyncio.Event())  # takes the request, never answers
    async with running(silent_engine) as silent:
        lost = on_node(endpoint(silent.url, "lost"), "n2")
        gw.pool.endpoints[MODEL] = [lost]
        async with gw.openai() as client:
            call = asyncio.create_task(client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}]))  # fmt: skip
            await until(lambda: silent.in_flight == 1)
            gw.router.node_lost("n1")  # another node: nothing of this request's changes
            await asyncio.sleep(0.1)
            assert not call.done()
            gw.pool.endpoints[MODEL] = [endpoint(gw.engine.url, "live")]  # n2 out of the pool
            gw.router.node_lost("n2")
            answer = await asyncio.wait_for(call, 5)
        assert answer.choices[0].message.content == FOLDED_TEXT
        assert len(gw.engine.seen) == 1
        await until(lambda: silent.in_flight == 0)  # its connection dropped
        assert gw.router.balancer.outstanding("lost") == 0


async def test_a_stream_begun_on_a_lost_node_ends_with_an_error_event(gw: Gateway) -> None:
    async with running(FakeEngine(hang_after_first=True)) as silent:
        gw.pool.endpoints[MODEL] = [on_node(endpoint(silent.url, "lost"), "n2")]
        texts: list[str] = []
        async with gw.openai() as client:
            stream = await client.completions.create(model=MODEL, prompt="x", stream=True)
            with pytest.raises(openai.APIError) as caught:
                async for chunk in stream:
                    texts.append(chunk.choices[0].text)
                    gw.router.node_lost("n2")
        assert texts == ["t0 "]
        assert "lost" in caught.value.message
        await asyncio.wait_for(silent.cancelled.wait(), 5)
        assert gw.router.balancer.outstanding("lost") == 0


# Logs.


async def test_one_log_line_per_request_without_the_key(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmgwd.router")
    await gw.post("/v1/chat/completions", CHAT)
    await gw.post("/v1/chat/completions", {"model": 5}, key=REVOKED_SECRET)
    await gw.post("/v1/chat/completions", {"model": 5})
    await gw.post("/v1/chat/completions", {**CHAT, "model": "evil\nPOST /v1/forged status=200"})
    lines = [r.getMessage() for r in caplog.records if r.name == "llmgwd.router"]
    assert len(lines) == 4
    assert "\n" not in lines[3] and "status=404" in lines[3]
    assert "POST /v1/chat/completions status=200" in lines[0]
    assert f"model={MODEL}" in lines[0] and "key=key-user" in lines[0]
    assert "status=401" in lines[1] and "key=key-old" in lines[1]
    assert "status=400" in lines[2] and "param" not in lines[2]
    assert not any(USER_SECRET in line or REVOKED_SECRET in line for line in lines)
    assert not any(ENGINE_KEY in line for line in caplog.messages)


async def test_the_log_line_names_the_clients_address_not_what_it_says_it_is(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmgwd.router")
    forged = {"X-Forwarded-For": "203.0.113.9", "X-Real-IP": "203.0.113.9"}
    headers = {"Authorization": f"Bearer {USER_SECRET}", **forged}
    async with gw.http.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers=headers) as r:
        assert r.status == 200
    (line,) = [r.getMessage() for r in caplog.records if r.name == "llmgwd.router"]
    assert "status=200" in line and " client=127.0.0.1 " in line and "203.0.113.9" not in line


# On-demand models.


class FakeWaker:
    """The reconciler's side of an on-demand model: a touch starts a replica after a while."""

    def __init__(self, pool: FakePool, url: str, start_s: float = 0.3) -> None:
        self.pool, self.url, self.start_s = pool, url, start_s
        self.touches = 0
        self.starts = 0

    def touch(self, name: str) -> None:
        self.touches += 1
        if not self.pool.endpoints.get(name) and self.starts == 0:
            self.starts += 1
            asyncio.get_running_loop().call_later(self.start_s, self._ready, name)

    def _ready(self, name: str) -> None:
        self.pool.endpoints[name] = [endpoint(self.url)]


def on_demand_router(pool: FakePool, waker: FakeWaker, timeout_s: float = 5.0) -> Router:
    models = FakeModels(MODEL)
    models._models[MODEL].on_demand = True
    return Router(FakeKeys(), models, pool, on_demand=waker, wake_timeout_s=timeout_s,
                  wake_poll_s=0.02)  # fmt: skip


async def test_requests_to_a_parked_model_wait_for_one_start_and_are_answered(
    engine: FakeEngine,
) -> None:
    pool = FakePool()
    waker = FakeWaker(pool, engine.url)
    async with serve(on_demand_router(pool, waker)) as url, aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {USER_SECRET}"}

        async def one() -> int:
            async with http.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers) as r:
                return r.status

        statuses = await asyncio.gather(*(one() for _ in range(20)))
    assert statuses == [200] * 20
    assert waker.starts == 1 and waker.touches >= 20
    assert len(engine.seen) == 20


async def test_a_model_that_does_not_wake_in_time_answers_503_with_retry_after(
    engine: FakeEngine,
) -> None:
    pool = FakePool()
    waker = FakeWaker(pool, engine.url, start_s=5.0)
    router = on_demand_router(pool, waker, timeout_s=0.2)
    async with serve(router) as url, aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {USER_SECRET}"}
        async with http.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers) as r:
            assert r.status == 503 and r.headers["Retry-After"]
            assert "starting" in (await r.json())["error"]["message"]
