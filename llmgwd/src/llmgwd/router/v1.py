"""The /v1 handlers: key check, body checks (router.fields), model lookup, then the proxy."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry

from llmgw.proxy import Route as ProxyRoute
from llmgwd.catalog import ApiKey, Model
from llmgwd.nodes.pool import Endpoint, Pool
from llmgwd.router import errors, expect, fields, overhead, prefix, transcriptions, v1_routes
from llmgwd.router.anthropic_errors import anthropic_shape, api_key_header
from llmgwd.router.balancer import Balancer
from llmgwd.router.exchange import EXCHANGE
from llmgwd.router.isolation import CacheIsolation, Mode
from llmgwd.router.metering import Meter, Reservation
from llmgwd.router.metrics import RouterMetrics
from llmgwd.router.providers import DEADLINE_S, Providers, upstream_body
from llmgwd.router.proxy import Upstream
from llmgwd.router.responses_errors import responses_shape
from llmgwd.router.route import Route
from llmgwd.router.token_bounds import Estimate, held_context, need
from llmgwd.router.usage_events import ask_for_usage

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
# The ready replicas read for a request's checks are its balancer's choice too, unless the
# request waited longer than this before being sent (the pool is read once, not twice).
READY_FRESH_S = 0.05

# Body keys some clients use to pick a server: the upstream only ever comes from the Pool.
ROUTING_KEYS = frozenset(
    {"api_base", "base_url", "url", "endpoint", "host", "api_key", "api_version", "upstream"}
)

Document = dict[str, Any]


class Keys(Protocol):
    """API keys, served from the daemon's in-memory cache."""

    def authenticate(self, secret: str) -> ApiKey | None:
        """The key whose secret this is (revoked ones included, or None for them), else None."""
        ...


class Models(Protocol):
    """The model catalog, served from memory."""

    def get(self, name: str) -> Model | None:
        """The model of that name, if in the catalog."""
        ...

    def all(self) -> list[Model]:
        """Every model in the catalog."""
        ...


class OnDemand(Protocol):
    """Wakes on-demand models (the reconciler)."""

    def touch(self, name: str) -> None:
        """A request for model name arrived: wake it if parked, keep it awake if not."""
        ...


class ModelCard(msgspec.Struct):
    """One entry of GET /v1/models, as OpenAI shapes it."""

    id: str
    created: int
    object: str = "model"
    owned_by: str = "llmgw"


class ModelList(msgspec.Struct):
    """GET /v1/models."""

    data: list[ModelCard]
    object: str = "list"


class Router:
    """The /v1 API as an aiohttp sub-application: mount `app` at /v1 on the client port."""

    def __init__(
        self,
        keys: Keys,
        models: Models,
        pool: Pool,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        connect_timeout_s: float = 3.0,
        read_timeout_s: float = 600.0,
        retry_after_s: int = 5,
        disconnect_poll_s: float = 0.2,
        meter: Meter | None = None,
        balancer: Balancer | None = None,
        on_demand: OnDemand | None = None,
        wake_timeout_s: float = 120.0,
        wake_poll_s: float = 0.2,
        stale_s: Callable[[], float] | None = None,
        prefix_aware: bool = True,
        registry: CollectorRegistry | None = None,
        max_audio_bytes: int = transcriptions.MAX_AUDIO_BYTES,
        uploads: transcriptions.Uploads | None = None,  # client.max_uploads_in_flight's spools
        count: bool = True,  # client.request_metrics: whether /v1 requests are counted
        cache_isolation: Mode = "org",  # client.cache_isolation (router/isolation.py)
        salt_secret: bytes = b"",  # the cluster secret: vLLM's cache_salt alike on every plane
        egress: ProxyRoute | None = None,  # network.proxy: external providers are outside
        provider_deadline_s: float = DEADLINE_S,  # client.provider_deadline_s
    ) -> None:
        # How long this control plane's view of keys and models may be out of date (0: not;
        # the daemon's _stale_s): over zero, every /v1 request gets a 503 store_unreachable.
        self._stale_s = stale_s
        self._on_demand = on_demand
        self._wake_timeout_s = wake_timeout_s
        self._wake_poll_s = wake_poll_s
        self._waking: dict[str, asyncio.Task[bool]] = {}  # one wait per model, shared
        self._keys = keys
        self._models = models
        self._pool = pool
        self._max_body_bytes = max_body_bytes
        self._max_audio_bytes = max_audio_bytes
        self._uploads = uploads if uploads is not None else transcriptions.Uploads()
        self._retry_after_s = retry_after_s
        self.balancer = (
            balancer if balancer is not None else Balancer(pool, prefix_aware=prefix_aware)
        )
        self.meter = meter if meter is not None else Meter()
        self._upstream = Upstream(
            self.balancer,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
            retry_after_s=retry_after_s,
            disconnect_poll_s=disconnect_poll_s,
            isolation=CacheIsolation(cache_isolation, salt_secret),
            providers=Providers(
                salt_secret,  # providers' credentials are sealed under a key of it
                connect_timeout_s=connect_timeout_s,
                read_timeout_s=read_timeout_s,
                retry_after_s=retry_after_s,
                egress=egress,
                deadline_s=provider_deadline_s,
            ),
        )
        self.isolation = self._upstream.isolation  # the daemon tells it the control planes
        self.metrics = RouterMetrics(registry or CollectorRegistry(), lambda m: bool(models.get(m)))
        self.app = self._application(count)

    def _application(self, count: bool) -> web.Application:
        """The /v1 sub-application: its middlewares (counting where count) and its routes."""
        ended = None
        if count:
            self.meter.on_settled = self.metrics.settled
            self.balancer.on_waited = self.metrics.waited
            ended = self.metrics.ended
        app = web.Application(middlewares=[errors.middleware(ended, v1_routes.for_request)])
        app.on_response_prepare.append(_answer_headers)
        app.on_cleanup.append(self._on_cleanup)
        app.router.add_get("/models", self._list_models)
        app.router.add_get("/models/{model:.+}", self._get_model)
        # Expect: 100-continue answered 100 only where the handler will read the body.
        app.on_response_prepare.append(expect.close_unsent)
        body = expect.continue_if(self._authenticate, self._max_body_bytes)
        for path, handler in (
            ("/chat/completions", self._chat),
            ("/completions", self._completions),
            ("/embeddings", self._embeddings),
            ("/responses", self._responses),
            ("/messages", self._messages),
            ("/messages/count_tokens", self._count_tokens),
            ("/rerank", self._rerank),
        ):
            app.router.add_post(path, handler, expect_handler=body)
        audio = expect.continue_if(self._authenticate, self._max_audio_bytes)
        app.router.add_post("/audio/transcriptions", self._transcriptions, expect_handler=audio)
        return app

    def node_lost(self, node: str) -> None:
        """A node was declared lost: its requests in flight are sent to other replicas."""
        self._upstream.node_lost(node)

    async def close(self) -> None:
        """Close the upstream session (also done when the mounting app cleans up)."""
        for task in self._waking.values():
            task.cancel()
        await self._upstream.close()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.close()

    async def _list_models(self, request: web.Request) -> web.Response:
        key = self._authenticate(request)
        listed = [m for m in self._models.all() if self.meter.allows(key, m.name)]
        return _json(ModelList(data=[_card(m) for m in listed]))

    async def _get_model(self, request: web.Request) -> web.Response:
        key = self._authenticate(request)
        name = request.match_info["model"]
        model = self._models.get(name)
        if model is None or not self.meter.allows(key, name):
            raise errors.model_not_found(name)
        return _json(_card(model))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, v1_routes.CHAT)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, v1_routes.COMPLETIONS)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, v1_routes.EMBEDDINGS)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        with responses_shape(request):
            return await self._complete(request, v1_routes.RESPONSES)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        with anthropic_shape():
            return await self._complete(request, v1_routes.MESSAGES)

    async def _count_tokens(self, request: web.Request) -> web.StreamResponse:
        with anthropic_shape():
            return await self._complete(request, v1_routes.COUNT_TOKENS)

    async def _rerank(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, v1_routes.RERANK)

    async def _transcriptions(self, request: web.Request) -> web.StreamResponse:
        """A multipart form, not JSON: the key checked before any of it is read, the request
        admitted once its model part is, the file spooled; passed on as the router writes
        it; one request and the tokens its answer reports."""
        key = self._authenticate(request)
        admitted: list[Reservation] = []
        ex = request[EXCHANGE]

        async def admit(name: str) -> None:
            ex.model = name
            model = self._models.get(name)
            if model is None:
                raise errors.model_not_found(name)
            if model.upstream is not None:
                self._upstream.providers.check(model, v1_routes.TRANSCRIPTIONS)
            await self._ready(model)
            admitted.append(await self.meter.reserve(key, model, Estimate(prompt=0, completion=0)))

        try:
            limit = self._max_audio_bytes
            async with transcriptions.read(request, limit, self._uploads, admit) as form:
                reservation = admitted[0]
                ex.tally = reservation.tally
                ex.rate_headers = reservation.headers
                name = reservation.model.name
                body, ex.body_type = form.body(name)
                # A memoryview of the spool's file when it spilled: the proxy and the engine
                # client only take its len() and hand it to the transport, which keeps it.
                sent = cast(bytes, body)
                route = v1_routes.TRANSCRIPTIONS
                return await self._upstream.forward(request, name, route, sent, False)
        finally:
            for reservation in admitted:
                reservation.settle()

    async def _complete(self, request: web.Request, route: Route) -> web.StreamResponse:
        """Check everything a client can get wrong (only the route's allowed fields pass),
        admit the request against its key's limits and budgets, hand the body to the proxy,
        then settle what the answer used."""
        check, bound = route.check, route.bound
        assert check is not None and bound is not None  # a route whose body is JSON
        ex = request[EXCHANGE]
        key = self._authenticate(request)
        raw = await _read_body(request, self._max_body_bytes)
        doc = _parse_object(raw)
        for field in ROUTING_KEYS:  # ignored, never refused: clients' libraries add them
            doc.pop(field, None)
        name = check(doc)
        ex.model = name
        model = self._models.get(name)
        if model is None:
            raise errors.model_not_found(name)
        self._for_engine(request, doc, model, route)
        ready = await self._ready(model)
        read_at = time.monotonic()
        context = held_context(model, ready)  # a longer prompt: the route's own 400
        bounds = bound(doc, model, len(raw), context)
        doc["model"] = model.name
        if model.upstream is not None:
            upstream_body(doc, model, route, self.isolation.provider_key(key))
        else:  # the engine's prompt cache kept apart per organization or key (isolation.py)
            self.isolation.apply(ex, key, model, doc)
        stream = doc.get("stream") is True
        # A whole answer is asked of the engine as a stream all the same, and folded: what
        # the engine made is counted even if the client leaves (router/folding.py).
        fold = not stream and route.fold is not None
        affinity = None
        if self.balancer.prefix is not None and len(ready) > 1:  # one replica: nothing to choose
            affinity = prefix.affinity_of(request, doc)
        reservation = await self.meter.reserve(key, model, bounds)
        # waited for a refill: the pool is read again
        fresh = ready if time.monotonic() - read_at <= READY_FRESH_S else None
        try:
            if (stream or fold) and route.usage_option:
                reservation.tally.pass_usage = ask_for_usage(doc) or fold
            if fold:
                doc["stream"] = ex.fold = True
            ex.tally = reservation.tally
            ex.rate_headers = reservation.headers
            body = msgspec.json.encode(doc)
            if model.upstream is not None:
                return await self._upstream.external(request, model, route, body, stream or fold)
            least = need(ready, len(raw), context)  # a replica holding less is not sent it
            return await self._upstream.forward(
                request, model.name, route, body, stream or fold, fresh, affinity, least
            )
        finally:
            reservation.settle()

    def _for_engine(self, request: web.Request, doc: Document, model: Model, route: Route) -> None:
        """Refuse what the model's engine lacks, or a route its external provider lacks."""
        if model.upstream is not None:
            self._upstream.providers.check(model, route)
            request[EXCHANGE].engine = "provider"
            return
        request[EXCHANGE].engine = model.engine
        fields.for_engine(doc, model, route.path)

    def _authenticate(self, request: web.Request) -> ApiKey:
        """The caller's key from `Authorization: Bearer KEY`; messages never quote the key."""
        stale = self._stale_s() if self._stale_s is not None else 0.0
        if stale > 0:
            raise errors.store_unreachable(stale, self._retry_after_s)
        header = request.headers.get("Authorization", "").strip() or api_key_header(request)
        if not header:
            raise errors.invalid_api_key(
                "Missing API key: send it as the header 'Authorization: Bearer KEY'."
            )
        scheme, _, secret = header.partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise errors.invalid_api_key(
                "Malformed Authorization header: expected 'Authorization: Bearer KEY'."
            )
        key = self._keys.authenticate(secret)
        if key is None:
            raise errors.invalid_api_key("Incorrect API key provided.")
        request[EXCHANGE].key_id = key.id
        if key.revoked:
            raise errors.invalid_api_key("This API key has been revoked.")
        return key

    async def _ready(self, model: Model) -> list[Endpoint]:
        """The model's ready replicas, an on-demand one woken first; none for an external
        provider's (its upstream is always there to try)."""
        if model.upstream is not None:
            return []
        if model.on_demand and self._on_demand is not None:
            await self._wake(model.name)
        return self._require_ready(model)

    async def _wake(self, name: str) -> None:
        """Wake an on-demand model and wait (bounded) for a replica; requests arriving
        together share one wait, and the model is woken once."""
        assert self._on_demand is not None
        self._on_demand.touch(name)
        if self._pool.ready(name):
            return
        task = self._waking.get(name)
        if task is None or task.done():
            task = asyncio.create_task(self._until_ready(name))
            self._waking[name] = task
        began = time.perf_counter()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), self._wake_timeout_s)
        woke = bool(self._pool.ready(name))
        self.metrics.woke(name, time.perf_counter() - began, woke)
        if not woke:
            message = f"The model '{errors.quote(name)}' is starting; retry later."
            raise errors.model_unavailable(message, self._retry_after_s)

    async def _until_ready(self, name: str) -> bool:
        # Polled: the pool is what agents last reported, and it has no event to wait on.
        # A request waiting keeps the model awake, as one arriving does.
        assert self._on_demand is not None
        for _ in range(max(1, int(self._wake_timeout_s / self._wake_poll_s))):
            if self._pool.ready(name):
                return True
            self._on_demand.touch(name)
            await asyncio.sleep(self._wake_poll_s)
        return bool(self._pool.ready(name))

    def _require_ready(self, model: Model) -> list[Endpoint]:
        """The model's ready replicas; 503 with Retry-After when there is none."""
        name = model.name
        if ready := self._pool.ready(name):
            return ready
        # The catalog says what is wanted: the pool knows only what reached a node.
        if model.replicas == 0:
            message = f"The model '{errors.quote(name)}' is in the catalog but not being served."
        else:
            message = f"No replica of the model '{errors.quote(name)}' is ready yet; retry later."
        raise errors.model_unavailable(message, self._retry_after_s)


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The body, refused as soon as it passes limit (declared or, when chunked, counted)."""
    length = request.content_length
    if length is not None and length > limit:
        raise errors.request_too_large(limit)
    body = bytearray()
    try:
        while chunk := await request.content.readany():
            body += chunk
            if len(body) > limit:
                raise errors.request_too_large(limit)
    except HttpProcessingError as e:  # too slow (408, the client port's gate), or broken
        if e.code == 408:
            raise errors.request_timeout(e.message) from None
        raise errors.invalid_json(f"The request body could not be read: {e.message}") from None
    except ConnectionError:  # the client left during its upload
        raise errors.client_closed() from None
    return bytes(body)


def _parse_object(body: bytes) -> Document:
    """The body as a JSON object."""
    if not body.strip():
        raise errors.invalid_json("The request body is empty: send a JSON object.")
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise errors.invalid_json(f"The request body is not valid JSON: {e}.") from None
    except RecursionError:
        raise errors.invalid_json("The request body is nested too deeply.") from None
    if not isinstance(doc, dict):
        raise errors.invalid_json(
            f"The request body must be a JSON object, not {errors.json_type(doc)}."
        )
    return doc


async def _answer_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare (one hook for all three): the request id, x-llmgw-overhead-ms
    and the admitted request's x-ratelimit-* headers, on every answer, streams too."""
    ex = request.get(EXCHANGE)
    if ex is None or not ex.request_id:  # the /v1 middleware did not run (router/expect.py)
        return
    response.headers["x-request-id"] = ex.request_id
    overhead.add_header(ex, response)
    if rate := ex.rate_headers:
        response.headers.update(rate)


def _card(model: Model) -> ModelCard:
    return ModelCard(id=model.name, created=int(model.created_at))


def _json(value: msgspec.Struct) -> web.Response:
    return web.Response(body=msgspec.json.encode(value), content_type="application/json")
