"""Who may hold the client port's connections: each client counted from its TCP accept (before
any TLS handshake), an IPv6 client by its /64, and one over its cap refused at once."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from asyncio.sslproto import SSLProtocol
from collections import Counter
from collections.abc import Callable, Sequence
from typing import cast

from llmgwd.router import errors

log = logging.getLogger("llmgwd.clientport.listener")

SERVER = "llmgw"  # the Server header: no aiohttp or Python version for a scanner to match


def peer_address(transport: asyncio.BaseTransport) -> str:
    """The client's IP address as text ('' when the transport has none)."""
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


def client_of(address: str) -> str:
    """Whom a connection is counted against: an IPv4 address (mapped ones too) as it is, an
    IPv6 address by its /64, which one host is routinely given whole."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return str(ip)


def too_many_connections(cap: int) -> bytes:
    """The whole HTTP answer to a plain-HTTP connection over its client's cap."""
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


# Connections over their client's cap that may wait, uncounted, for the first byte saying
# whether they can be told so (FirstByte): one a client, so many in all; the rest are
# aborted at once, so a client opening idle connections holds no more than its cap and one.
OVER_CAP_WAITERS_PER_CLIENT = 1
OVER_CAP_WAITERS = 16


class ConnectionGate:
    """Counts each client's open connections and refuses one over the cap; 0: no cap."""

    def __init__(self, cap: int, uncapped: Sequence[str]) -> None:
        self.cap = cap
        self._uncapped = [ipaddress.ip_network(net, strict=False) for net in uncapped]
        self._open: Counter[str] = Counter()
        self._told: set[str] = set()  # clients at the cap, logged once until they drop under
        self._waiting: Counter[str] = Counter()  # over-cap connections waiting (FirstByte)

    def wait_over_cap(self, address: str) -> str | None:
        """Let a connection admit refused wait, uncounted, for its first byte: the client it
        waits for, or None (abort it) where that client or all together have as many
        waiting as OVER_CAP_WAITERS_PER_CLIENT or OVER_CAP_WAITERS allow."""
        client = client_of(address)
        if self._waiting[client] >= OVER_CAP_WAITERS_PER_CLIENT:
            return None
        if self._waiting.total() >= OVER_CAP_WAITERS:
            return None
        self._waiting[client] += 1
        return client

    def end_wait(self, client: str) -> None:
        """A connection wait_over_cap let wait got its first byte or closed."""
        self._waiting[client] -= 1
        if self._waiting[client] <= 0:
            del self._waiting[client]

    def admit(self, address: str) -> str | None:
        """Count a new connection from address: the client it counts against, or None (no)."""
        client = client_of(address)
        if self.cap and self._open[client] >= self.cap and not self._exempt(address):
            if client not in self._told:
                self._told.add(client)
                log.warning("%s holds %d connections, the cap: refusing more", client, self.cap)
            return None
        self._open[client] += 1
        return client

    def release(self, client: str) -> None:
        """A connection admit counted against client closed."""
        self._open[client] -= 1
        if self._open[client] < self.cap:
            self._told.discard(client)
        if self._open[client] <= 0:
            del self._open[client]

    def _exempt(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in net for net in self._uncapped)


class CountedTLS(SSLProtocol):
    """asyncio's server-side TLS layer under one HTTP connection, counted by the gate from the
    TCP accept to the close, its handshake done or not, and its handshake timed: asyncio's own
    TLS server calls the HTTP protocol only once the handshake is done."""

    def __init__(
        self, app: asyncio.BaseProtocol, tls: ssl.SSLContext, gate: ConnectionGate, timeout: float
    ) -> None:
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()  # a failed handshake's error, which nobody waits for
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())
        # asyncio takes the handshake timeout in seconds as a float; typeshed says int.
        super().__init__(
            loop, app, tls, waiter, server_side=True, ssl_handshake_timeout=cast(int, timeout)
        )
        self._gate = gate
        self._client: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._client = self._gate.admit(peer_address(transport))
        if self._client is None:  # no handshake, so no HTTP answer: the connection just closes
            cast(asyncio.Transport, transport).abort()
            return
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._client is not None:
            self._gate.release(self._client)
            self._client = None
        super().connection_lost(exc)


_TLS_HANDSHAKE = 0x16  # the first byte of a TLS record carrying a handshake (a ClientHello)
_OVER_CAP_WAIT_S = 1.0


class FirstByte(asyncio.Protocol):
    """A connection to a port that serves TLS and plain HTTP both, until its first byte says
    which: a TLS handshake record (0x16), else an HTTP request line. Counted by the gate and
    closed after timeout seconds of silence meanwhile, as the protocol it hands over to is.
    One over its client's cap waits a second at most, uncounted, for the byte that says
    whether it can be told so (plain HTTP's 429) or is just closed (TLS): one a client and
    OVER_CAP_WAITERS in all (ConnectionGate.wait_over_cap); any other is aborted at once."""

    def __init__(
        self,
        tls: Callable[[], asyncio.BaseProtocol],
        plain: Callable[[], asyncio.BaseProtocol],
        gate: ConnectionGate,
        timeout: float,
    ) -> None:
        self._tls, self._plain, self._gate, self._timeout = tls, plain, gate, timeout
        self._transport: asyncio.Transport | None = None
        self._client: str | None = None
        self._waiting: str | None = None  # over the cap, waiting uncounted: its client
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        address = peer_address(transport)
        self._client = self._gate.admit(address)
        if self._client is None:
            self._waiting = self._gate.wait_over_cap(address)
            if self._waiting is None:  # enough wait already: closed, as CountedTLS does
                self._transport.abort()
                return
        wait = self._timeout if self._client is not None else _OVER_CAP_WAIT_S
        self._timer = asyncio.get_running_loop().call_later(wait, self._transport.abort)

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or not data or self._timer is None:
            return
        over_cap = self._client is None
        self._release()  # the protocol taking over counts the connection itself
        if data[0] == _TLS_HANDSHAKE and over_cap:
            transport.abort()  # as CountedTLS does: no answer without a handshake
            return
        proto = (self._tls if data[0] == _TLS_HANDSHAKE else self._plain)()
        transport.set_protocol(proto)
        proto.connection_made(transport)
        if transport.is_closing():
            return  # refused (over the cap)
        if isinstance(proto, asyncio.BufferedProtocol):
            _feed(proto, data)
        elif isinstance(proto, asyncio.Protocol):
            proto.data_received(data)

    def eof_received(self) -> bool | None:
        return None  # the transport closes

    def connection_lost(self, exc: BaseException | None) -> None:
        self._release()

    def _release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._client is not None:
            self._gate.release(self._client)
            self._client = None
        if self._waiting is not None:
            self._gate.end_wait(self._waiting)
            self._waiting = None


def _feed(proto: asyncio.BufferedProtocol, data: bytes) -> None:
    """Hand data to a buffered protocol (asyncio's TLS layer) as its transport would."""
    view = memoryview(data)
    while view:
        buf = memoryview(proto.get_buffer(len(view)))
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        proto.buffer_updated(n)
        view = view[n:]
