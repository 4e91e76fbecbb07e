"""GET /metrics (llmgwd's registry) and GET /metrics/engines (the engines' own, relayed) in
Prometheus' text format, on the client port and the local socket.

Who may scrape: on the client port, a peer on the loopback (a Prometheus on this host) or the
bearer of an API key with a staff role (viewer and up: an admin key today); on the local
socket, whoever the socket admits. The series hold no secret, but they tell a cluster's
models, nodes and traffic, which are not every key holder's to read."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from llmgwd import auth
from llmgwd.auth import KeyLookup
from llmgwd.router import errors

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PATH = "/metrics"
ENGINES_PATH = "/metrics/engines"
Render = Callable[[], Awaitable[bytes]]


def of(registry: CollectorRegistry) -> Render:
    """What renders registry's series, as Prometheus reads them."""

    async def render() -> bytes:
        return generate_latest(registry)

    return render


async def answer(render: Render) -> web.Response:
    """The rendered series as Prometheus' text format."""
    return web.Response(body=await render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def loopback(remote: str | None) -> bool:
    """Whether the peer's address is a loopback one (IPv4, IPv6 or IPv4-mapped)."""
    try:
        address = ipaddress.ip_address((remote or "").split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def client_handler(render: Render, keys: KeyLookup) -> Handler:
    """The client port's /metrics: loopback peers, or a staff key as `Authorization: Bearer`."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if not loopback(request.remote):
            scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
            key = keys.authenticate(secret.strip()) if scheme.lower() == "bearer" else None
            if key is None or key.revoked:
                message = "Metrics need a staff API key: send 'Authorization: Bearer KEY'."
                return errors.invalid_api_key(message).response()
            if auth.of_key(key).staff is None:
                message = f"Key {key.id} has no staff role: it may not read the metrics."
                return errors.ApiError(403, message, "permission_error").response()
        return await answer(render)

    return handler


def socket_handler(render: Render) -> Handler:
    """The local socket's /metrics (its own middleware admits the caller)."""

    async def handler(_request: web.Request) -> web.StreamResponse:
        return await answer(render)

    return handler
