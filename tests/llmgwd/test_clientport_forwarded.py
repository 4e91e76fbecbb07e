"""client.trusted_proxies: X-Forwarded-For's right-most untrusted address is the client, for the
access line and the per-address cap, only when the connection comes from a listed proxy."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmgw.config import ClientPort
from llmgwd.api.access import private_path
from llmgwd.catalog import Catalog
from llmgwd.clientport import listener
from llmgwd.clientport.forwarded import TrustedProxies, client_address
from llmgwd.metrics import endpoint as metrics_endpoint
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.test_clientport import llmgwd

FORGED = "198.51.100.66"
REAL = "203.0.113.9"


@pytest.mark.parametrize(
    ("peer", "header", "client"),
    [
        ("10.0.0.5", [f"{FORGED}, {REAL}"], REAL),  # the proxy appended the real one
        ("10.0.0.5", [FORGED, f"{REAL}, 10.0.0.7"], REAL),  # through a second listed hop
        ("10.0.0.5", ["10.0.0.8, 10.0.0.7"], "10.0.0.8"),  # all listed: the left-most
        ("10.0.0.5", [f"{FORGED}, junk, 10.0.0.7"], "10.0.0.7"),  # the walk ends at junk
        ("10.0.0.5", [], "10.0.0.5"),  # no header: the proxy itself
        ("192.0.2.1", [REAL], "192.0.2.1"),  # not a listed proxy: never believed
        ("::ffff:10.0.0.5", ["[2001:db8::1]"], "2001:db8::1"),
    ],
)
def test_the_right_most_untrusted_address_when_the_peer_is_trusted(
    peer: str, header: list[str], client: str
) -> None:
    assert TrustedProxies(["10.0.0.0/24"]).client(peer, header) == client


async def _access_line(tmp_path: Any, caplog: pytest.LogCaptureFixture, **client: Any) -> str:
    caplog.set_level(logging.INFO, logger="llmgwd.router")
    async with llmgwd(tmp_path, **client) as port, aiohttp.ClientSession() as s:
        headers = {"X-Forwarded-For": f"{FORGED}, {REAL}"}
        async with s.get(f"http://127.0.0.1:{port.port}/v1/models", headers=headers) as r:
            assert r.status == 401
    (line,) = [r.getMessage() for r in caplog.records if r.name == "llmgwd.router"]
    return line


async def test_the_access_line_names_the_forwarded_client_behind_a_trusted_proxy(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    line = await _access_line(tmp_path, caplog, trusted_proxies=("127.0.0.1",))
    assert f" client={REAL} " in line and FORGED not in line


async def test_the_access_line_believes_no_header_from_a_peer_not_listed(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    line = await _access_line(tmp_path, caplog, trusted_proxies=("192.0.2.0/24",))
    assert " client=127.0.0.1 " in line and REAL not in line and FORGED not in line


@asynccontextmanager
async def _held_port(settings: ClientPort) -> AsyncIterator[tuple[str, asyncio.Event]]:
    """The client port serving one route that answers once the event is set (so requests
    stay in flight), with its client's address as the body."""
    release = asyncio.Event()

    async def hold(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text=client_address(request))

    app = web.Application()
    app.router.add_get("/hold", hold)
    runner = await listener.serve(app, settings, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/hold", release
    finally:
        release.set()
        await runner.cleanup()


async def _two_at_once(settings: ClientPort, first: str, second: str) -> list[tuple[int, str]]:
    """Two requests on two connections, the first in flight while the second is sent."""
    async with (
        _held_port(settings) as (url, release),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s,
    ):

        async def get(forwarded: str) -> tuple[int, str]:
            try:
                async with s.get(url, headers={"X-Forwarded-For": forwarded}) as r:
                    return r.status, await r.text()
            except aiohttp.ClientError:
                return 0, "closed"

        held = asyncio.create_task(get(first))
        await asyncio.sleep(0.3)
        answered = asyncio.create_task(get(second))
        await asyncio.sleep(0.3)
        release.set()
        return list(await asyncio.wait_for(asyncio.gather(held, answered), 5))


CAP_ONE: dict[str, Any] = {"max_connections_per_address": 1, "uncapped_addresses": ()}


async def test_a_trusted_proxy_s_clients_are_capped_each_not_the_proxy() -> None:
    settings = ClientPort(listen="127.0.0.1:0", trusted_proxies=("127.0.0.1",), **CAP_ONE)
    assert await _two_at_once(settings, REAL, FORGED) == [(200, REAL), (200, FORGED)]
    (held, refused) = await _two_at_once(settings, REAL, f"{FORGED}, {REAL}")
    assert held == (200, REAL)
    assert refused[0] == 429 and "too_many_connections" in refused[1]


async def test_a_peer_not_listed_is_capped_by_its_own_address_whatever_it_forwards() -> None:
    settings = ClientPort(listen="127.0.0.1:0", trusted_proxies=("192.0.2.1",), **CAP_ONE)
    (held, refused) = await _two_at_once(settings, REAL, FORGED)
    assert held == (200, "127.0.0.1")
    assert refused[0] == 429 and "connections from your address" in refused[1]


async def _ask(settings: ClientPort, app: web.Application, path: str, headers: Any) -> Any:
    """One GET through the client port serving app: its status and body."""
    runner = await listener.serve(app, settings, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}{path}"
        async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
            return r.status, await r.text()
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("trusted", "headers", "private"),
    [
        ((), {"X-Forwarded-For": REAL}, "True"),  # no proxy listed: this host's own loopback
        (("127.0.0.1",), {"X-Forwarded-For": REAL}, "False"),  # a client on the network
        (("127.0.0.1",), {"X-Forwarded-For": REAL, "X-Forwarded-Proto": "https"}, "True"),
        (("127.0.0.1",), {"X-Forwarded-For": REAL, "X-Forwarded-Proto": "https, http"}, "False"),
        (("127.0.0.1",), {}, "True"),  # the proxy's own host asking, forwarding for no one
    ],
)
async def test_behind_a_trusted_proxy_the_client_s_hop_decides_what_is_private(
    trusted: tuple[str, ...], headers: dict[str, str], private: str
) -> None:
    async def ask(request: web.Request) -> web.Response:
        return web.Response(text=str(private_path(request)))

    app = web.Application()
    app.router.add_get("/private", ask)
    settings = ClientPort(listen="127.0.0.1:0", trusted_proxies=trusted)
    assert await _ask(settings, app, "/private", headers) == (200, private)


async def test_open_metrics_on_loopback_are_not_open_to_a_proxy_s_clients() -> None:
    async def render() -> bytes:
        return b"llmgw_up 1\n"

    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()

    def app() -> web.Application:
        a = web.Application()
        a.router.add_get("/metrics", metrics_endpoint.client_handler(render, catalog, store, True))
        return a

    try:
        direct = ClientPort(listen="127.0.0.1:0")
        assert await _ask(direct, app(), "/metrics", {}) == (200, "llmgw_up 1\n")
        proxied = ClientPort(listen="127.0.0.1:0", trusted_proxies=("127.0.0.1",))
        status, _ = await _ask(proxied, app(), "/metrics", {"X-Forwarded-For": REAL})
        assert status == 401
    finally:
        await store.close()
