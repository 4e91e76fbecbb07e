"""The client port's HTTP server: aiohttp's, with its own refusals in our error shapes and no
byte of a request in them or in a log, time and rate limits on reading a request, a cap on one
client's connections (clientgate), CORS for the origins the settings name, and `Server: llmgw`."""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.streams import StreamReader
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_protocol import RequestHandler

from llmgw import fdstore
from llmgw.config import ClientPort
from llmgw.errors import ANTHROPIC, API_V1, HF, SCIM
from llmgwd.api.base import API_PREFIX
from llmgwd.clientport.forwarded import (
    CLIENT,
    PROXIED,
    TrustedProxies,
    client_address,
    forwarded_for,
)
from llmgwd.clientport.gate import (
    SERVER,
    ConnectionGate,
    CountedTLS,
    FirstByte,
    peer_address,
    too_many_connections,
)
from llmgwd.clientport.tls import tls_context
from llmgwd.mirror import hub_server
from llmgwd.router import errors
from llmgwd.scim.users import PREFIX as SCIM_PREFIX

log = logging.getLogger("llmgwd.clientport.listener")

# aiohttp's default backlog (128) overflowed with a few hundred clients connecting at once
# (bench/router: 5,000 streams); the kernel caps this at net.core.somaxconn.
BACKLOG = 4096
# Stopping: how long idle keep-alive connections may still bring a request (then cut), and
# how long then an answer in flight (a stream) may take. With the local socket's 4 s and the
# store's close, within the unit's TimeoutStopSec=30s.
DRAIN_IDLE_S = 2.0
SHUTDOWN_S = 20.0
FDNAME = "client-port"  # its sockets' name in systemd's store


class BodyTimeout(HttpProcessingError):
    """What reading a request body raises once it stalled or came too slowly (408)."""


# Errors answered before any handler runs, in the shape of the route asked for.


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def answer(path: str, error: errors.ApiError) -> web.Response:
    """error in the shape of the sub-app path is under: /api/v1's ErrorAnswer, SCIM's error
    document under /scim/v2, Anthropic's under /v1/messages, the hub's under /hf, OpenAI's
    anywhere else."""
    if _under(path, API_PREFIX):
        response = error.reshaped(API_V1).response()
    elif _under(path, SCIM_PREFIX):
        response = error.reshaped(SCIM).response()
    elif _under(path, "/v1/messages"):
        response = error.reshaped(ANTHROPIC).response()
    elif _under(path, hub_server.PREFIX):
        response = error.reshaped(HF).response()
    else:
        response = error.response()
    response.headers.update(error.headers)
    response.headers["Server"] = SERVER
    return response


def parse_error(exc: BaseException | None, limit: int) -> errors.ApiError:
    """What aiohttp's parser refused, said without quoting a byte of the request."""
    if isinstance(exc, LineTooLong):
        return errors.ApiError(
            431,
            f"Request header fields too large: a header or the request line is longer than "
            f"{limit} bytes.",
            "invalid_request_error",
            code="request_header_fields_too_large",
        )
    return errors.ApiError(
        400,
        "Malformed HTTP request: its request line or headers could not be parsed.",
        "invalid_request_error",
        code="malformed_request",
    )


def own_error(status: int, exc: BaseException | None, limit: int) -> errors.ApiError:
    """The error for aiohttp's handle_error(status, exc)."""
    if status == 504:
        return errors.ApiError(504, "The request timed out.", "server_error", code="timeout")
    if status >= 500:
        return errors.ApiError(
            status, "The server had an error while processing your request.", "server_error"
        )
    return parse_error(exc, limit)


_REQUEST_LINE = re.compile(rb"[A-Z]{1,16} (/[^ ?\r\n]{0,64})")


def _target(data: bytes, last: str) -> str:
    """The path of the request line data begins with (its first 64 bytes), else last."""
    m = _REQUEST_LINE.match(data)
    return m.group(1).decode("latin-1") if m else last


def safe_trace(exc: BaseException) -> str:
    """An exception's class and frames, never its text (which may quote the request)."""
    return type(exc).__name__ + "\n" + "".join(traceback.format_tb(exc.__traceback__))


# aiohttp's connection protocol and server, made for the client port.


class ClientProtocol(RequestHandler):
    """One client connection: its head within head_timeout_s, no body stall past
    body_timeout_s nor a body slower on average than body_min_bytes_per_s after body_grace_s,
    its client under the cap, and aiohttp's own errors said safely. The time the server does
    not read (a handler not reading yet) is not the client's, and is not counted."""

    def __init__(self, manager: ClientServer, *, counted: bool = True, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._gate = manager.gate if counted else None  # with TLS, CountedTLS counts
        self._settings = manager.settings
        self._head_s = manager.settings.head_timeout_s
        self._client: str | None = None  # set once counted by the gate (without TLS)
        self._peer = ""  # the client's address, for the log
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._paused_s = 0.0  # seconds this connection's reading was paused by the server
        self._paused_at: float | None = None
        self._body: StreamReader | None = None  # the body of the last request whose head came
        self._body_start = 0.0  # in client time (_client_time) from here on
        self._body_last = 0.0  # when its last byte came
        self._body_bytes = 0
        self._target = "/"  # the path of the last request line seen, for handle_error's shape

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._peer = peer_address(transport)
        if self._gate is not None:
            self._client = self._gate.admit(self._peer)
            if self._client is None:
                self.force_close()  # nothing of this connection is read
                writer = cast(asyncio.Transport, transport)
                writer.write(too_many_connections(self._gate.cap))
                writer.close()
                return
        super().connection_made(transport)
        self._head_timer = self._loop.call_later(self._head_s, self._head_late)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._gate is not None and self._client is not None:
            self._gate.release(self._client)
            self._client = None
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._force_close or self._close:
            return
        heads = self._request_count
        if self._body is None or self._body.is_eof():
            self._target = _target(data, self._target)
        super().data_received(data)
        now = self._client_time()
        if self._request_count != heads and self._messages:  # one or more whole heads came
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            self._body = self._messages[-1][1]
            self._body_start = self._body_last = now
            self._body_bytes = 0
        elif data:
            self._body_last = now
            self._body_bytes += len(data)
        if self._body is not None and not self._body.is_eof():
            if self._body_timer is None:
                self._body_timer = self._loop.call_later(self._body_left(), self._body_late)
        elif data and self._request_count == heads and self._head_timer is None:
            self._head_timer = self._loop.call_later(self._head_s, self._head_late)

    # aiohttp pauses the socket's reading when a handler does not read what came: that wait
    # is the server's, so the body's clock stops.

    def _pause_transport_reading(self) -> None:
        if self._paused_at is None:
            self._paused_at = self._loop.time()
        super()._pause_transport_reading()

    def _resume_transport_reading(self) -> None:
        if self._paused_at is not None:
            self._paused_s += self._loop.time() - self._paused_at
            self._paused_at = None
        super()._resume_transport_reading()

    def _client_time(self) -> float:
        """The loop's clock less the time reading was paused."""
        now = self._loop.time()
        paused = self._paused_s
        if self._paused_at is not None:
            paused += now - self._paused_at
        return now - paused

    def _body_left(self) -> float:
        """Seconds of client time until the body stalled too long or came too slowly."""
        s, now = self._settings, self._client_time()
        left = self._body_last + s.body_timeout_s - now
        if s.body_min_bytes_per_s:
            whole = s.body_grace_s + self._body_bytes / s.body_min_bytes_per_s
            left = min(left, self._body_start + whole - now)
        return left

    def _head_late(self) -> None:
        """No whole request head in head_timeout_s: close, unless a request is being answered."""
        self._head_timer = None
        if self._force_close or self.transport is None:
            return
        if self._request_in_progress or self._messages:
            self._head_timer = self._loop.call_later(self._head_s, self._head_late)
            return
        log.info("closed a connection from %s: no request head in %g s", self._peer, self._head_s)
        self.force_close()

    def _body_late(self) -> None:
        """The body stalled, or came too slowly: reading it fails, and the connection closes."""
        self._body_timer = None
        body = self._body
        if body is None or body.is_eof() or self.transport is None:
            return
        left = self._body_left()
        if left > 0:
            self._body_timer = self._loop.call_later(left, self._body_late)
            return
        s = self._settings
        if self._body_last + s.body_timeout_s <= self._client_time():
            why = f"The request body stalled for {s.body_timeout_s:g} s."
        else:
            why = (
                f"The request body came slower than {s.body_min_bytes_per_s} bytes/s "
                f"(after {s.body_grace_s:g} s)."
            )
        log.info("a request body from %s was refused: %s", self._peer, why)
        body.set_exception(BodyTimeout(code=408, message=why))
        self.close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse or a handler that broke: ours,
        in JSON, quoting nothing of the request; the log names the exception's class only."""
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was sent already; the connection closes")
        error = own_error(status, exc, self.max_field_size)
        if status >= 500 and exc is not None:
            log.error("%s from %s failed: %s", status, client_address(request), safe_trace(exc))
        else:
            kind = type(exc).__name__ if exc is not None else "?"
            who = client_address(request)
            log.info("refused a request from %s: %s (%d)", who, kind, error.status)
        # A request aiohttp could not parse comes as its ERROR message (path "/"): the path of
        # the request line read (kept only to choose the error's shape) picks the shape.
        path = self._target if request.method == "UNKNOWN" else request.path
        response = answer(path, error)
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's other failures: its own text, the exception's class and frames only."""
        exc = kw.get("exc_info")
        if isinstance(exc, BodyTimeout):  # answered and logged already; the connection closes
            return
        what = str(args[0] % args[1:]) if args else "failure"
        trace = safe_trace(exc) if isinstance(exc, BaseException) else ""
        log.error("%s: %s", what, trace)


class ClientServer(web.Server):
    """aiohttp's Server, making ClientProtocol connections that share one gate."""

    def __init__(
        self,
        base: web.Server,
        settings: ClientPort,
        own_tls: ssl.SSLContext | None = None,
        gate: ConnectionGate | None = None,
    ) -> None:
        # The same handler, request factory and protocol arguments as the app's own Server.
        super().__init__(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            **base._kwargs,
        )
        self.settings = settings
        self.tls = tls_context(settings) or own_tls
        # With llmgwd's own certificate, plain HTTP is still served on the port (its first
        # byte tells) unless client.plain_http is false; a site's own certificate is TLS only.
        self.plain_too = own_tls is not None and not settings.tls_cert and settings.plain_http
        self.gate = gate or connection_gate(settings)
        self.draining = False

    def pre_shutdown(self) -> None:
        """The port has stopped accepting: from now on every answer says Connection: close,
        and no idle connection is cut yet (aiohttp would cut them here, racing a request a
        client is sending on one; see shutdown)."""
        self.draining = True

    async def shutdown(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 (aiohttp's)
        """Give idle keep-alive connections DRAIN_IDLE_S to bring their next request (whose
        answer ends them) or to close; then cut the rest and finish what is in flight."""
        loop = asyncio.get_running_loop()
        until = loop.time() + DRAIN_IDLE_S
        # aiohttp forgets a connection in a task's done callback: no event says none is left.
        while self.connections and loop.time() < until:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        super().pre_shutdown()
        await super().shutdown(timeout)

    # asyncio's server calls this at each TCP accept; with TLS, what it makes is the TLS layer,
    # which counts the connection from then on and hands the HTTP protocol its decrypted side.
    # aiohttp types Server() as making its RequestHandler; asyncio takes any protocol.
    def __call__(self) -> asyncio.BaseProtocol:  # type: ignore[override]  # not a RequestHandler
        if self.tls is None:
            return self._plain()
        if self.plain_too:
            return FirstByte(self._tls, self._plain, self.gate, self.settings.head_timeout_s)
        return self._tls()

    def _plain(self) -> ClientProtocol:
        return ClientProtocol(self, loop=self._loop, **self._kwargs)

    def _tls(self) -> CountedTLS:
        assert self.tls is not None
        http = ClientProtocol(self, counted=False, loop=self._loop, **self._kwargs)
        return CountedTLS(http, self.tls, self.gate, self.settings.head_timeout_s)


def connection_gate(settings: ClientPort) -> ConnectionGate:
    """The cap on each client's connections; a trusted proxy's own are not capped (it brings
    many clients: behind_proxies holds each of them to the cap on requests at once)."""
    uncapped = (*settings.uncapped_addresses, *settings.trusted_proxies)
    return ConnectionGate(settings.max_connections_per_address, uncapped)


def behind_proxies(proxies: TrustedProxies, gate: ConnectionGate) -> Middleware:
    """Each request's client address (forwarded.CLIENT: X-Forwarded-For's when its peer is a
    trusted proxy); a client that a proxy brings holds at most the cap of requests at once,
    counted by the connections' gate as its own connections would be."""

    @web.middleware
    async def client(request: web.Request, handler: Handler) -> web.StreamResponse:
        peer = request.remote or ""
        address = request[CLIENT] = proxies.client(peer, forwarded_for(request))
        request[PROXIED] = proxies.trusts(peer)
        if address == peer:
            return await handler(request)
        counted = gate.admit(address)
        if counted is None:
            why = (f"Too many requests at once from your address (the limit is {gate.cap}); "
                   f"wait for some to finish.")  # fmt: skip
            refused = errors.ApiError(429, why, "requests", code="too_many_connections",
                                      headers={"Retry-After": "1"})  # fmt: skip
            return answer(request.path, refused)
        try:
            return await handler(request)
        finally:
            gate.release(counted)

    return client


class ClientRunner(web.AppRunner):
    """An AppRunner whose server is a ClientServer."""

    def __init__(
        self,
        app: web.Application,
        settings: ClientPort,
        own_tls: ssl.SSLContext | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self.settings = settings
        self.own_tls = own_tls
        self.gate = connection_gate(settings)

    async def _make_server(self) -> web.Server:
        base = await super()._make_server()
        return ClientServer(base, self.settings, self.own_tls, self.gate)


# The application's side: CORS, the Server header, and errors outside /v1 and /api/v1.

Prepare = Callable[[web.Request, web.StreamResponse], Awaitable[None]]
_CORS_HEADERS = (
    "Access-Control-Allow-Origin",
    "Access-Control-Allow-Credentials",
    "Access-Control-Allow-Methods",
    "Access-Control-Allow-Headers",
    "Access-Control-Expose-Headers",
    "Access-Control-Max-Age",
)


def cors(origins: Sequence[str]) -> tuple[Middleware, Prepare]:
    """A middleware answering the preflights of the listed origins, and an on_response_prepare
    hook that lets those origins read answers; nothing for any other Origin, no credentials."""
    listed = frozenset(o.rstrip("/").lower() for o in origins)

    def allowed(request: web.Request) -> str | None:
        origin = request.headers.get("Origin", "")
        return origin if origin.lower() in listed else None

    @web.middleware
    async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
        asks = "Access-Control-Request-Method" in request.headers
        if request.method != "OPTIONS" or not asks or allowed(request) is None:
            return await handler(request)
        headers = {
            "Access-Control-Allow-Methods": "GET, POST, PUT, PATCH, DELETE",
            # `*` covers the other headers of a request without credentials, not Authorization.
            "Access-Control-Allow-Headers": "Authorization, *",
            "Access-Control-Max-Age": "600",
        }
        return web.Response(status=204, headers=headers)

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        for name in _CORS_HEADERS[:2]:  # whatever else set them, only ours go out
            response.headers.popall(name, None)
        origin = allowed(request)
        if origin is not None:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers.setdefault("Access-Control-Expose-Headers", "*")
        if listed:
            response.headers.add("Vary", "Origin")
        response.headers["Server"] = SERVER

    return preflight, on_prepare


@web.middleware
async def errors_outside(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's refusals outside the sub-apps (a 404 at /) in OpenAI's shape."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return answer(request.path, errors.from_http_exception(request, e))


def closing_when_draining(runner: ClientRunner) -> Prepare:
    """An answer sent while llmgwd stops ends its connection (Connection: close): the client's
    next request opens a new one, which systemd's kept socket queues for the next llmgwd."""

    async def closing(request: web.Request, response: web.StreamResponse) -> None:
        server = runner.server
        if isinstance(server, ClientServer) and server.draining:
            response.force_close()  # the connection ends after this answer
            response.headers["Connection"] = "close"  # aiohttp wrote its headers already

    return closing


async def serve(
    app: web.Application,
    settings: ClientPort,
    host: str,
    port: int,
    own_tls: ssl.SSLContext | None = None,
) -> ClientRunner:
    """Serve app (its sub-apps added) on the client port; the caller cleans the runner up.
    With own_tls (llmgwd's own certificate) and no site certificate, TLS and plain HTTP both
    (TLS only with settings.plain_http false)."""
    preflight, on_prepare = cors(settings.cors_origins)
    # With no origin listed there is no preflight to answer: one middleware less a request.
    app.middlewares[:0] = [errors_outside, preflight] if settings.cors_origins else [errors_outside]
    app.on_response_prepare.append(on_prepare)
    runner = ClientRunner(app, settings, own_tls, access_log=None,
                          shutdown_timeout=SHUTDOWN_S)  # fmt: skip
    if settings.trusted_proxies:  # else no middleware: a request's client is its peer
        app.middlewares.insert(0, behind_proxies(TrustedProxies(settings.trusted_proxies),
                                                 runner.gate))  # fmt: skip
    app.on_response_prepare.append(closing_when_draining(runner))
    await runner.setup()
    # TLS, when configured, is the ClientServer's own (CountedTLS), not the site's. The
    # sockets outlive a restart in systemd's store: a request sent meanwhile waits, not refused.
    for sock in fdstore.listeners(FDNAME, host, port, BACKLOG):
        await web.SockSite(runner, sock).start()
    return runner
