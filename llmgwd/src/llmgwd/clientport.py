"""The client port's HTTP server: aiohttp's, with its own refusals in our error shapes and no
byte of a request in them or in a log, time limits on reading a request, a cap on one address's
connections, CORS for the origins the settings name, and a Server header that says `llmgw`."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.streams import StreamReader
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_protocol import RequestHandler

from llmgw.config import ClientPort
from llmgwd import api
from llmgwd.router import errors

log = logging.getLogger("llmgwd.clientport")

SERVER = "llmgw"  # the Server header: no aiohttp or Python version for a scanner to match
# aiohttp's default backlog (128) overflowed with a few hundred clients connecting at once
# (bench/router: 5,000 streams); the kernel caps this at net.core.somaxconn.
BACKLOG = 4096


class BodyTimeout(HttpProcessingError):
    """A request body that stalled: what reading it raises once body_timeout_s passed."""


# Errors answered before any handler runs, in the shape of the route asked for.


def answer(path: str, error: errors.ApiError) -> web.Response:
    """error in /api/v1's shape under /api/v1, in OpenAI's shape anywhere else."""
    if path == api.API_PREFIX or path.startswith(api.API_PREFIX + "/"):
        d = error.detail
        code = d.code or d.type
        response = api.error_response(api.ApiError(error.status, d.message, d.type, code))
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


def too_many_connections(cap: int) -> bytes:
    """The whole HTTP answer to a connection over its address's cap."""
    body = errors.ApiError(
        429,
        f"Too many open connections from your address (the limit is {cap}); close some "
        f"or reuse them.",
        "requests",
        code="too_many_connections",
    ).body()
    head = (
        "HTTP/1.1 429 Too Many Requests\r\n"
        f"Server: {SERVER}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def safe_trace(exc: BaseException) -> str:
    """An exception's class and frames, never its text (which may quote the request)."""
    return type(exc).__name__ + "\n" + "".join(traceback.format_tb(exc.__traceback__))


# One address's connections.


def peer_address(transport: asyncio.BaseTransport) -> str:
    """The client's IP address as text ('' when the transport has none)."""
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


class ConnectionGate:
    """Counts each address's open connections and refuses one over the cap; 0: no cap."""

    def __init__(self, cap: int, uncapped: Sequence[str]) -> None:
        self.cap = cap
        self._uncapped = [ipaddress.ip_network(net, strict=False) for net in uncapped]
        self._open: Counter[str] = Counter()
        self._told: set[str] = set()  # addresses at the cap, logged once until they drop under

    def admit(self, address: str) -> bool:
        """Count a new connection from address, or say no."""
        if self.cap and self._open[address] >= self.cap and not self._exempt(address):
            if address not in self._told:
                self._told.add(address)
                log.warning("%s holds %d connections, the cap: refusing more", address, self.cap)
            return False
        self._open[address] += 1
        return True

    def release(self, address: str) -> None:
        """A counted connection closed."""
        self._open[address] -= 1
        if self._open[address] < self.cap:
            self._told.discard(address)
        if self._open[address] <= 0:
            del self._open[address]

    def _exempt(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in net for net in self._uncapped)


# aiohttp's connection protocol and server, made for the client port.


class ClientProtocol(RequestHandler):
    """One client connection: its head within head_timeout_s, no body stall past
    body_timeout_s, its address under the cap, and aiohttp's own errors said safely."""

    def __init__(self, manager: ClientServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._gate = manager.gate
        self._head_s = manager.settings.head_timeout_s
        self._body_s = manager.settings.body_timeout_s
        self._address: str | None = None  # set once counted by the gate
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_deadline = 0.0
        self._body: StreamReader | None = None  # the body of the last request whose head came

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        address = peer_address(transport)
        if not self._gate.admit(address):
            self.force_close()  # nothing of this connection is read
            writer = cast(asyncio.Transport, transport)
            writer.write(too_many_connections(self._gate.cap))
            writer.close()
            return
        self._address = address
        super().connection_made(transport)
        self._head_timer = self._loop.call_later(self._head_s, self._head_late)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._address is not None:
            self._gate.release(self._address)
            self._address = None
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._force_close or self._close:
            return
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads and self._messages:  # one or more whole heads came
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            self._body = self._messages[-1][1]
        if self._body is not None and not self._body.is_eof():
            if data or self._request_count != heads:
                self._body_deadline = self._loop.time() + self._body_s
                if self._body_timer is None:
                    self._body_timer = self._loop.call_at(self._body_deadline, self._body_late)
        elif data and self._request_count == heads and self._head_timer is None:
            self._head_timer = self._loop.call_later(self._head_s, self._head_late)

    def _head_late(self) -> None:
        """No whole request head in head_timeout_s: close, unless a request is being answered."""
        self._head_timer = None
        if self._force_close or self.transport is None:
            return
        if self._request_in_progress or self._messages:
            self._head_timer = self._loop.call_later(self._head_s, self._head_late)
            return
        log.info(
            "closed a connection from %s: no request head in %g s", self._address, self._head_s
        )
        self.force_close()

    def _body_late(self) -> None:
        """The body stalled past body_timeout_s: reading it fails, and the connection closes."""
        self._body_timer = None
        body, now = self._body, self._loop.time()
        if body is None or body.is_eof() or self.transport is None:
            return
        if self._reading_paused:  # the handler has not read what came: the wait is ours
            self._body_deadline = now + self._body_s
        if now < self._body_deadline:
            self._body_timer = self._loop.call_at(self._body_deadline, self._body_late)
            return
        log.info("a request body from %s stalled for %g s: refused", self._address, self._body_s)
        body.set_exception(
            BodyTimeout(code=408, message=f"The request body stalled for {self._body_s:g} s.")
        )
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
            log.error("%s from %s failed: %s", status, request.remote, safe_trace(exc))
        else:
            kind = type(exc).__name__ if exc is not None else "?"
            log.info("refused a request from %s: %s (%d)", request.remote, kind, error.status)
        response = answer(request.path, error)
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

    def __init__(self, base: web.Server, settings: ClientPort) -> None:
        # The same handler, request factory and protocol arguments as the app's own Server.
        super().__init__(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            **base._kwargs,
        )
        self.settings = settings
        self.gate = ConnectionGate(
            settings.max_connections_per_address, settings.uncapped_addresses
        )

    def __call__(self) -> RequestHandler:
        return ClientProtocol(self, loop=self._loop, **self._kwargs)


class ClientRunner(web.AppRunner):
    """An AppRunner whose server is a ClientServer."""

    def __init__(self, app: web.Application, settings: ClientPort, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.settings = settings

    async def _make_server(self) -> web.Server:
        return ClientServer(await super()._make_server(), self.settings)


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


def tls_context(settings: ClientPort) -> ssl.SSLContext | None:
    """The client port's TLS context, when a certificate is configured."""
    if not settings.tls_cert:
        return None
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(settings.tls_cert, settings.tls_key or None)
    return tls


async def serve(app: web.Application, settings: ClientPort, host: str, port: int) -> ClientRunner:
    """Serve app (its sub-apps added) on the client port; the caller cleans the runner up."""
    preflight, on_prepare = cors(settings.cors_origins)
    app.middlewares[:0] = [errors_outside, preflight]
    app.on_response_prepare.append(on_prepare)
    runner = ClientRunner(app, settings, access_log=None, shutdown_timeout=10.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls_context(settings), backlog=BACKLOG)
    await site.start()
    return runner
