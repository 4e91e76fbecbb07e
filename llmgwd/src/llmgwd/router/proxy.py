"""The upstream call: engine_client's pooled connections, another replica on a refused connect, a
pooled connection the engine had closed replaced by a fresh one, streaming passed through chunk by
chunk (or folded into a whole answer: router/folding.py), the engine told as soon as the client
leaves and what it still sends counted, and the requests in flight on a node that is lost sent to
another replica. An external provider's model (router/providers.py) takes the same path past the
balancer: no replica, slot or node of its own."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from llmgwd.catalog import Model
from llmgwd.nodes.pool import Endpoint
from llmgwd.router import answers, errors, folding, overhead
from llmgwd.router.balancer import Balancer
from llmgwd.router.engine_client import (
    Answer,
    ConnectFailed,
    ConnectionLost,
    EngineClient,
    EngineError,
    ReadTimeout,
)
from llmgwd.router.exchange import EXCHANGE
from llmgwd.router.isolation import CacheIsolation
from llmgwd.router.prefix import Affinity
from llmgwd.router.providers import Providers
from llmgwd.router.route import Route
from llmgwd.router.usage_events import Tally
from llmgwd.router.waitlist import Busy

log = logging.getLogger("llmgwd.router")

# A pooled connection the engine had closed fails before any byte of an answer (ConnectionLost,
# not answered): its FIN seen, or its reset (llama-server closes a connection after every
# streamed answer while its headers promised keep-alive; any server may close an idle one).
# A pooled connection the engine had closed while idle fails as soon as the request is written
# (its FIN or reset is already there); one that fails later was read by an engine that then
# worked on it and died, and must not be sent again (it could kill every replica in turn).
_STALE_WINDOW_S = 1.0
_MAX_CACHED = 4096  # engine keys remembered, before they are all forgotten
_MAX_TAIL = 1 << 20  # a partial SSE event longer than this is passed on anyway
_SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # a reverse proxy in front must not buffer either
}

_ENGINE_FAULTS = (502, 504)  # our answers for an engine that broke the exchange or went silent


class Reply(Protocol):
    """What the relay reads of an answer: an engine's (engine_client.Answer) or an external
    provider's (providers.ProviderReply)."""

    status: int
    content_type: str

    @property
    def headers(self) -> dict[str, str]:
        """The answer's headers."""
        ...

    async def read(self) -> bytes:
        """The whole body."""
        ...

    async def readany(self) -> bytes:
        """What came since the last read; b"" at the end."""
        ...

    def finish_writing(self) -> None:
        """Tell the far side the client left (a FIN), where it can be told."""
        ...

    def close(self) -> None:
        """Drop the connection unless the answer was read whole."""
        ...


class _Unreachable(Exception):
    """The replica did not take the request: it refused or timed out on connect, or answered
    503 (llama.cpp's answer while it loads) before any byte: another replica may take it."""


@dataclass(eq=False, slots=True)
class _Flight:
    """One exchange with a replica, and whether the node it runs on was declared lost."""

    task: asyncio.Task[Any]
    abandoned: bool = False


@dataclass
class _Flights:
    """The exchanges in flight per node: a node cut off sends no reset, so its requests would
    otherwise wait out the read timeout."""

    by_node: dict[str, set[_Flight]] = field(default_factory=dict)

    def enter(self, node: str) -> _Flight:
        """Count the current task's exchange as in flight on node until leave()."""
        task = asyncio.current_task()
        assert task is not None  # only ever called from a request's handler
        flight = _Flight(task)
        flights = self.by_node.get(node)
        if flights is None:
            flights = self.by_node[node] = set()
        flights.add(flight)
        return flight

    def leave(self, node: str, flight: _Flight) -> None:
        """The exchange ended (a plain pair rather than a context manager: it is on every
        request's path)."""
        flights = self.by_node.get(node)
        if flights is not None and flight in flights:
            flights.discard(flight)
            if not flights:
                del self.by_node[node]

    def abandon(self, node: str) -> int:
        """Interrupt every exchange in flight on node; how many there were."""
        flights = self.by_node.pop(node, set())
        for flight in flights:
            flight.abandoned = True
            flight.task.cancel()
        return len(flights)


class Upstream:
    """Sends requests to engine replicas chosen by the balancer and relays their answers."""

    def __init__(
        self,
        balancer: Balancer,
        *,
        connect_timeout_s: float = 3.0,
        read_timeout_s: float = 600.0,
        retry_after_s: int = 5,
        disconnect_poll_s: float = 0.2,
        drain_s: float = 30.0,
        isolation: CacheIsolation | None = None,
        providers: Providers | None = None,
    ) -> None:
        self._balancer = balancer
        self.providers = providers if providers is not None else Providers(
            b"", connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s,
            retry_after_s=retry_after_s,
        )  # fmt: skip
        self._drain_s = drain_s  # the longest an engine's rest is read after its client left
        self._drains: set[asyncio.Task[None]] = set()
        self.isolation = isolation if isolation is not None else CacheIsolation()
        # No total timeout: a stream lasts as long as the engine keeps sending. Keep-alive
        # below llama-server's 5 s, so that a pooled connection is seldom stale.
        self._client = EngineClient(
            connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s, keepalive_s=4.0
        )
        self._retry_after_s = retry_after_s
        self._watch = _Watch(disconnect_poll_s)
        self._flights = _Flights()
        self._bearers: dict[str, str] = {}

    def node_lost(self, node: str) -> int:
        """The node is gone (cut off past its grace period): each request in flight there goes
        to another replica, or, if its stream had begun, ends with an error event. How many."""
        moved = self._flights.abandon(node)
        if moved:
            log.warning("node %s lost with %d request(s) in flight there", node, moved)
        return moved

    async def close(self) -> None:
        """Stop reading what engines send after their clients left (each such request settles
        with what was counted), and close the pooled connections to engines."""
        drains = list(self._drains)
        for task in drains:
            task.cancel()
        await asyncio.gather(*drains, return_exceptions=True)
        await self._client.close()
        await self.providers.close()

    async def forward(
        self,
        request: web.Request,
        model: str,
        route: Route,
        body: bytes,
        stream: bool,
        ready: list[Endpoint] | None = None,
        affinity: Affinity | None = None,
        need: int = 0,
    ) -> web.StreamResponse:
        """Relay body to `{replica}/v1/{route.path}` and its answer back to the client; ready: the
        model's ready replicas as the caller just read them from the pool, if it did;
        affinity: what ties the request to a replica (router/prefix.py), if anything; need:
        the least context a replica must run with to take it (token_bounds.need; 0: any)."""
        work = self._try_replicas(request, model, route, body, stream, ready, affinity, need)
        return await self._answered(request, work)

    async def external(
        self, request: web.Request, model: Model, route: Route, body: bytes, stream: bool
    ) -> web.StreamResponse:
        """Relay body to the model's external provider and its answer back, as an engine's: no
        slot taken, no replica to try next (the upstream's own limits bound it)."""
        endpoint = self.providers.endpoint(model)
        return await self._answered(
            request, self._exchange(request, endpoint, route, body, stream, model)
        )

    async def _answered(
        self, request: web.Request, work: Coroutine[Any, Any, web.StreamResponse]
    ) -> web.StreamResponse:
        """work's answer, or the stream begun when the client left (or a 499)."""
        done = await self._unless_gone(request, work)
        if done is not None:
            return done
        ex = request[EXCHANGE]
        ex.outcome = "client_gone"
        started = ex.stream
        if started is not None:
            return started
        raise errors.client_closed()

    async def _try_replicas(
        self,
        request: web.Request,
        model: str,
        route: Route,
        body: bytes,
        stream: bool,
        ready: list[Endpoint] | None,
        affinity: Affinity | None,
        need: int,
    ) -> web.StreamResponse:
        """One replica after another until one takes the request, each on a free slot of a
        replica that holds it (the first choice among ready, the pool read again for each later
        one)."""
        tried: list[str] = []
        while (endpoint := await self._acquire(model, tried, affinity, ready, need)) is not None:
            answer = await self._attempt(request, endpoint, route, body, stream)
            if answer is not None:
                return answer
            tried.append(endpoint.replica_id)
            ready = None
        raise errors.model_unavailable(
            f"No replica of model '{errors.quote(model)}' could take the request; retry later.",
            self._retry_after_s,
        )

    async def _acquire(
        self,
        model: str,
        tried: list[str],
        affinity: Affinity | None,
        ready: list[Endpoint] | None,
        need: int,
    ) -> Endpoint | None:
        """A slot on a replica not tried yet that runs with at least need tokens of context,
        waited for in line when all are full."""
        try:
            return await self._balancer.acquire(model, tried, affinity, ready, need)
        except Busy as e:
            why = "its queue is full" if e.why == "full" else "no slot freed while it waited"
            message = f"The model '{errors.quote(model)}' is busy ({why}); retry later."
            raise errors.model_busy(message, self._retry_after_s) from None

    async def _attempt(
        self, request: web.Request, endpoint: Endpoint, route: Route, body: bytes, stream: bool
    ) -> web.StreamResponse | None:
        """One replica's try on the slot kept for it: its answer, or None when another replica
        may take the request. What failed counts toward taking the replica out of the pool."""
        ejections = self._balancer.ejections
        flight = self._flights.enter(endpoint.node)
        ex = request[EXCHANGE]
        lease, ticket, whole = None, ex.ticket, False
        if ticket is not None:  # llama.cpp's slot and whether it may reuse its cached prompt
            body, lease = self.isolation.lease(ticket, endpoint, route.slots, body)
        try:
            answer = await self._exchange(request, endpoint, route, body, stream)
            whole = answer.status == 200 and ex.outcome != "upstream_broke"
        except _Unreachable:
            ejections.failed(endpoint.replica_id)
            return None
        except asyncio.CancelledError:
            # uncancel: one cancel is ours; any other (the client left, shutdown) goes on.
            if not flight.abandoned or flight.task.uncancel() > 0:
                raise
            return await self._abandoned(request, endpoint, route)
        except errors.ApiError as e:
            if e.status in _ENGINE_FAULTS:
                ejections.failed(endpoint.replica_id)
            raise
        finally:
            self._flights.leave(endpoint.node, flight)
            self._balancer.release(endpoint)
            self.isolation.done(endpoint, lease, whole)
        # A stream it cut short, or its 5xx answer (router/answers.py maps those that were the
        # client's fault to 4xx: they do not count).
        if ex.outcome == "upstream_broke" or answer.status in _ENGINE_FAULTS:
            ejections.failed(endpoint.replica_id)
        else:
            ejections.succeeded(endpoint.replica_id)
        return answer

    async def _abandoned(
        self, request: web.Request, endpoint: Endpoint, route: Route
    ) -> web.StreamResponse | None:
        """After node_lost: None (another replica may answer) unless the stream had begun."""
        ex = request[EXCHANGE]
        rid, started = ex.request_id, ex.stream
        if started is None:
            log.warning(
                "replica %s of %s: node %s lost with the request in flight; sent elsewhere, rid=%s",
                endpoint.replica_id, endpoint.model, endpoint.node, rid,
            )  # fmt: skip
            return None
        log.warning(
            "replica %s of %s: node %s lost mid-stream, rid=%s",
            endpoint.replica_id, endpoint.model, endpoint.node, rid,
        )  # fmt: skip
        ex.outcome = "upstream_broke"
        failure = errors.upstream_failed("The node serving the model was lost mid-answer.")
        await started.write(route.shape(failure, _events(ex.tally)).sse_event())
        return started

    async def _exchange(
        self,
        request: web.Request,
        endpoint: Endpoint,
        route: Route,
        body: bytes,
        stream: bool,
        provider: Model | None = None,
    ) -> web.StreamResponse:
        """Send to one replica (or provider's model's upstream) and relay its answer."""
        ex = request[EXCHANGE]
        ex.replica = endpoint.replica_id
        overhead.engine_sent(ex)
        upstream: Reply
        if provider is not None:
            upstream = await self.providers.post(provider, route, body, stream)
        else:
            upstream = await self._connect(request, endpoint, route, body, stream)
        overhead.engine_answered(ex)  # its headers: a stream's own share
        tally = ex.tally or Tally()  # what the answer says it used, for the meter
        owned = True  # the answer is closed here, unless a drain took it over
        try:
            if upstream.status == 503:  # loading (or full): nothing was done, no byte passed on
                log.warning(
                    "replica %s of %s on %s answered 503, rid=%s",
                    endpoint.replica_id, endpoint.model, endpoint.node, ex.request_id,
                )  # fmt: skip
                raise _Unreachable
            if stream and upstream.status == 200 and upstream.content_type == "text/event-stream":
                relay = _Relay(endpoint.model, route, tally, provider is not None)
                try:
                    return await self._stream(request, upstream, endpoint, route, relay)
                except (asyncio.CancelledError, ConnectionResetError):
                    if self._client_left(request):
                        owned = False
                        self._drain(upstream, relay)
                    raise
            return await self._relay_whole(request, upstream, endpoint, route, tally)
        finally:
            # A no-op after a complete answer; otherwise drops the connection so the
            # engine stops generating (a shutdown, a node lost).
            if owned:
                upstream.close()

    def _stream(
        self,
        request: web.Request,
        upstream: Reply,
        endpoint: Endpoint,
        route: Route,
        relay: _Relay,
    ) -> Coroutine[Any, Any, web.StreamResponse]:
        """The engine's stream relayed to the client, or folded into a whole answer."""
        if request[EXCHANGE].fold:
            return self._fold(request, upstream, endpoint, route, relay)
        return self._relay_stream(request, upstream, endpoint, route, relay)

    def _client_left(self, request: web.Request) -> bool:
        """Whether the request's client is gone (rather than the daemon stopping, or the
        node lost)."""
        task = asyncio.current_task()
        return _client_gone(request) or (task is not None and self._watch.left(task))

    def _drain(self, upstream: Reply, relay: _Relay) -> None:
        """The client left: the engine is told at once (its connection half-closed, so it
        stops generating) and what it still sends is read and counted, for at most drain_s;
        the request settles when that ends (Tally.drained)."""
        relay.tally.draining = True
        task = asyncio.get_running_loop().create_task(self._read_rest(upstream, relay))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def _read_rest(self, upstream: Reply, relay: _Relay) -> None:
        try:
            upstream.finish_writing()
            async with asyncio.timeout(self._drain_s):
                while chunk := await upstream.readany():
                    relay.feed(chunk)
            relay.rest()
        except (TimeoutError, EngineError):
            pass  # counted until then
        finally:
            upstream.close()
            relay.tally.drained()

    async def _connect(
        self, request: web.Request, endpoint: Endpoint, route: Route, body: bytes, stream: bool
    ) -> Answer:
        """POST to the replica with its own key; the client's headers are never passed on."""
        headers = self._headers(request, endpoint, stream)
        try:
            return await self._post(request, endpoint, f"/v1/{route.path}", body, headers)
        except ConnectFailed as e:
            log.warning(
                "replica %s of %s on %s unreachable, rid=%s: %s",
                endpoint.replica_id,
                endpoint.model,
                endpoint.node,
                request[EXCHANGE].request_id,
                e,
            )
            raise _Unreachable from e
        except ReadTimeout:
            raise errors.upstream_timeout("The model's engine did not answer in time.") from None
        except (EngineError, ValueError) as e:  # ValueError: an address or header unfit to send
            raise _engine_failed(endpoint, e) from None

    def _headers(self, request: web.Request, endpoint: Endpoint, stream: bool) -> dict[str, str]:
        """The engine's own key, never the client's headers. A stream to llama.cpp asks for its
        connection to be closed after it: llama-server closes it anyway without saying so in
        its headers (a request sent on it next is dropped unanswered), and a connection both
        sides know is closing never goes back to the pool. vLLM's keeps it: pooled."""
        ex = request[EXCHANGE]
        headers = {
            "Authorization": self._bearer(endpoint.api_key),
            "Content-Type": ex.body_type,
            "Accept": "text/event-stream" if stream else "application/json",
            "x-request-id": ex.request_id,
            # No compressed answer to inflate (the router reads every answer), no library
            # version told to the engine.
            "Accept-Encoding": "identity",
            "User-Agent": "llmgw",
        }
        if stream and ex.engine != "vllm":
            headers["Connection"] = "close"
        return headers

    def _bearer(self, api_key: str) -> str:
        """The engine's Authorization header, made once per key."""
        header = self._bearers.get(api_key)
        if header is None:
            if len(self._bearers) > _MAX_CACHED:  # replicas come and go: never a leak
                self._bearers.clear()
            header = self._bearers[api_key] = f"Bearer {api_key}"
        return header

    async def _post(
        self,
        request: web.Request,
        endpoint: Endpoint,
        target: str,
        body: bytes,
        headers: dict[str, str],
    ) -> Answer:
        """The POST on a pooled connection; once more on a fresh one when the pooled one fails
        at once (the engine had closed it: it never had the request, so this is no failure of
        the replica). The retry failing in any way, a refused connect included, is a 502
        counted against the replica, never a move to another replica."""
        sent = time.monotonic()
        try:
            return await self._client.post(endpoint.url, target, headers, body)
        except ConnectionLost as e:
            quick = time.monotonic() - sent < _STALE_WINDOW_S
            if not e.reused or e.answered or not quick:
                raise
            log.info(
                "replica %s of %s on %s: pooled connection found closed (%s); sent again on a "
                "fresh one, rid=%s",
                endpoint.replica_id, endpoint.model, endpoint.node, e,
                request[EXCHANGE].request_id,
            )  # fmt: skip
        try:
            return await self._client.post(endpoint.url, target, headers, body, fresh=True)
        except ReadTimeout:
            raise errors.upstream_timeout("The model's engine did not answer in time.") from None
        except EngineError as e:
            raise _engine_failed(endpoint, e) from None

    async def _relay_whole(
        self,
        request: web.Request,
        upstream: Reply,
        endpoint: Endpoint,
        route: Route,
        tally: Tally,
    ) -> web.Response:
        """A non-streamed answer with OpenAI's fields only, or the engine's refusal in OpenAI's
        shape (an answer all the same: it does not count against the replica)."""
        try:
            data = await upstream.read()
            overhead.engine_answered(request[EXCHANGE])
        except ReadTimeout:
            raise errors.upstream_timeout("The model's engine did not answer in time.") from None
        except EngineError as e:
            raise _engine_failed(endpoint, e) from None
        if upstream.status == 200:
            content_type = upstream.headers.get("content-type", "application/json")
            body = answers.success_body(data, endpoint.model, tally, route)
            return web.Response(status=200, body=body, headers={"Content-Type": content_type})
        error = answers.engine_error(upstream.status, data, endpoint.model, route)
        log.info(
            "replica %s of %s answered %d; the client gets %d (%s)",
            endpoint.replica_id, endpoint.model, upstream.status, error.status,
            error.detail.code,
        )  # fmt: skip
        return error.response()

    async def _relay_stream(
        self,
        request: web.Request,
        upstream: Reply,
        endpoint: Endpoint,
        route: Route,
        relay: _Relay,
    ) -> web.StreamResponse:
        """Server-sent events written as they arrive, each cleaned by router/answers.py; an
        engine failure ends them with an error."""
        out = web.StreamResponse(status=200, headers=_SSE_HEADERS)
        await out.prepare(request)
        ex = request[EXCHANGE]
        ex.stream = out
        tally = relay.tally
        tally.stream_started()
        while True:
            try:
                chunk = await upstream.readany()
            except EngineError as e:
                ex.outcome = "upstream_broke"
                failure = (
                    errors.upstream_timeout("The model's engine stopped sending.")
                    if isinstance(e, ReadTimeout)
                    else _engine_failed(endpoint, e)
                )
                # the partial event held back is dropped
                await out.write(route.shape(failure, tally.events or 0).sse_event())
                return out
            if not chunk:
                break
            if ready := relay.feed(chunk):  # the usage chunk may be held back
                await out.write(ready)
        if rest := relay.rest():
            await out.write(rest)
        return out

    async def _fold(
        self,
        request: web.Request,
        upstream: Reply,
        endpoint: Endpoint,
        route: Route,
        relay: _Relay,
    ) -> web.Response:
        """A stream the client did not ask for, read whole, folded into the route's answer and
        cleaned once (its tokens counted as they come, for a client that leaves); the
        engine's error event is the answer's error."""
        tally = relay.tally
        tally.stream_started()
        folder, tokens = folding.Folder(route), route.tokens
        while True:
            try:
                chunk = await upstream.readany()
            except ReadTimeout:
                raise errors.upstream_timeout("The model's engine stopped sending.") from None
            except EngineError as e:
                raise _engine_failed(endpoint, e) from None
            except asyncio.CancelledError:  # the client left: what the engine said it read
                folder.tell(endpoint.model, tally)
                raise
            if not chunk:
                break
            tally.count(chunk.count(b"\n\n"), len(tokens.findall(chunk)))
            folder.feed(chunk)
        tally.first_at = 0.0  # its client saw no first token: not in the first-token histogram
        overhead.engine_answered(request[EXCHANGE])
        if folder.error is not None:
            status, model = folder.error_status, endpoint.model
            return answers.engine_error(status, folder.error, model, route).response()
        try:
            whole = folder.answer()
        except folding.Unfinished as e:
            raise _engine_failed(endpoint, e) from None
        body = answers.success_body(whole, endpoint.model, tally, route)
        return web.Response(status=200, body=body, headers={"Content-Type": "application/json"})

    async def _unless_gone(
        self, request: web.Request, work: Coroutine[Any, Any, web.StreamResponse]
    ) -> web.StreamResponse | None:
        """Run work; None (work cancelled at once) if the client disconnects first.

        aiohttp does not cancel a handler when its client leaves (unless the daemon asks for
        handler_cancellation), so the connections of all requests in flight are checked by
        one timer (self._watch), which cancels the handler's own task: no task, future or
        timer of its own for each request.
        """
        task = asyncio.current_task()
        assert task is not None  # only ever called from a request's handler
        self._watch.add(task, request)
        try:
            return await work
        except asyncio.CancelledError:
            if self._watch.left(task) and task.uncancel() == 0:
                return None  # our cancel only: the client left
            raise
        except ConnectionResetError:  # a write to the client failed: it is gone
            return None
        finally:
            self._watch.discard(task)


class _Watch:
    """Cancels the handler of each request whose client's connection closed, all of them
    checked every poll_s by one timer that runs while any is watched."""

    def __init__(self, poll_s: float) -> None:
        self._poll_s = poll_s
        self._watched: dict[asyncio.Task[Any], web.Request] = {}
        self._gone: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, task: asyncio.Task[Any], request: web.Request) -> None:
        """Watch request's connection; task is its handler."""
        self._watched[task] = request
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._poll_s, self._check)

    def left(self, task: asyncio.Task[Any]) -> bool:
        """Whether task was cancelled here because its client left."""
        return task in self._gone

    def discard(self, task: asyncio.Task[Any]) -> None:
        """No more checks for task."""
        self._watched.pop(task, None)
        self._gone.discard(task)

    def _check(self) -> None:
        self._timer = None
        for task, request in self._watched.items():
            if task not in self._gone and not task.done() and _client_gone(request):
                self._gone.add(task)
                task.cancel()
        if self._watched:
            self._timer = asyncio.get_running_loop().call_later(self._poll_s, self._check)


class _Relay:
    """A stream's events as they are read from the engine: whole events only, each cleaned and
    counted by router/answers.py."""

    __slots__ = ("cleaned", "events", "tally")

    def __init__(self, model: str, route: Route, tally: Tally, provider: bool = False) -> None:
        self.tally = tally
        self.events = _Events()
        self.cleaned = answers.Stream(model, route, tally, provider)

    def feed(self, chunk: bytes) -> bytes:
        """The whole events chunk completes, cleaned."""
        return self.cleaned.relay(self.events.feed(chunk))

    def rest(self) -> bytes:
        """What is left at the end, cleaned."""
        return self.cleaned.relay(self.events.rest())


class _Events:
    """Passes on whole SSE events only, so an error event never lands inside a cut one."""

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        """The complete events so far; a partial last one is held until its end arrives."""
        data = self._tail + chunk if self._tail else chunk
        cut = _event_end(data)
        if cut == 0 and len(data) < _MAX_TAIL:
            self._tail = data
            return b""
        cut = cut or len(data)
        self._tail = data[cut:]
        return data[:cut]

    def rest(self) -> bytes:
        """What is left when the engine ends its answer."""
        rest, self._tail = self._tail, b""
        return rest


def _event_end(data: bytes) -> int:
    """The offset just past the last blank line (event boundary) in data, or 0."""
    ends = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n") if (i := data.rfind(sep)) >= 0]
    return max(ends, default=0)


def _events(tally: Tally | None) -> int:
    """The stream events relayed to the client so far, where counted."""
    return tally.events or 0 if tally is not None else 0


def _client_gone(request: web.Request) -> bool:
    """Whether the client's connection is closed."""
    transport = request.transport
    return transport is None or transport.is_closing()


def _engine_failed(endpoint: Endpoint, e: BaseException) -> errors.ApiError:
    """502 for an engine that broke the exchange; the message names no address or key."""
    log.warning(
        "replica %s of %s on %s failed: %r", endpoint.replica_id, endpoint.model, endpoint.node, e
    )
    return errors.upstream_failed(f"The model's engine failed ({type(e).__name__}).")
