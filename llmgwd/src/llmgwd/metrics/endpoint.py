"""GET /metrics (llmgwd's registry) and GET /metrics/engines (the engines' own, relayed) in
Prometheus' text format, on the client port and the local socket.

Who may scrape: on the client port, the bearer of the scrape token (`llmgw metrics token`,
which reads these two paths and nothing else) or of an API key with a staff role (viewer and
up), and a peer on the loopback only where `metrics.loopback_open` says so (a reverse proxy
on the host would bring the world from there); on the local socket, whoever the socket
admits. The series hold no secret, but they tell a cluster's models, nodes and traffic, which
are not every key holder's to read."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from llmgwd import auth
from llmgwd.auth import KeyLookup
from llmgwd.clientport import forwarded
from llmgwd.people.directory import Directory
from llmgwd.router import errors
from llmgwd.store import Store, StoreUnavailable
from llmgwd.stored_token import StoredToken, bearer

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PATH = "/metrics"
ENGINES_PATH = "/metrics/engines"
TOKEN = StoredToken("/metrics/token", "metrics-llmgw-")  # the scrape token's sha256 hex
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


async def refusal(secret: str, keys: KeyLookup, store: Store) -> errors.ApiError | None:
    """Why the bearer of secret may not scrape, or None: the scrape token passes, and an API
    key of a staff role (a staff person's own key by their role, looked up now)."""
    if secret.startswith(TOKEN.prefix):
        if await TOKEN.matches(store, secret):
            return None
        return errors.invalid_api_key("The metrics token is not valid (a newer one replaced it?).")
    key = keys.authenticate(secret) if secret else None
    if key is None or key.revoked:
        message = "Metrics need the scrape token (llmgw metrics token) or a staff API key: "
        return errors.invalid_api_key(message + "send 'Authorization: Bearer TOKEN'.")
    if not await auth.allowed(auth.of_key(key), auth.STAFF_READ, {}, Directory(store)):
        message = f"Key {key.id} has no staff role: it may not read the metrics."
        return errors.ApiError(403, message, "permission_error")
    return None


def client_handler(render: Render, keys: KeyLookup, store: Store, loopback_open: bool) -> Handler:
    """The client port's /metrics: the scrape token or a staff key as `Authorization: Bearer`,
    or (loopback_open) any peer on the loopback."""

    async def handler(request: web.Request) -> web.StreamResponse:
        # Behind a trusted proxy, the client it forwards for, never the proxy's own address.
        if not (loopback_open and loopback(forwarded.client_address(request))):
            try:
                refused = await refusal(bearer(request), keys, store)
            except StoreUnavailable:
                message = "The cluster's store is unreachable: the credential cannot be checked."
                refused = errors.ApiError(503, message, "server_error", code="store_unreachable")
            if refused is not None:
                log.info("a scrape of %s from %s refused: %s", request.path, request.remote,
                         refused.detail.message)  # fmt: skip
                return refused.response()
        return await answer(render)

    return handler


def socket_handler(render: Render) -> Handler:
    """The local socket's /metrics (its own middleware admits the caller)."""

    async def handler(_request: web.Request) -> web.StreamResponse:
        return await answer(render)

    return handler
