"""The proxy for calls that leave the cluster, and none for those inside it: mirror B asks its
hub (mirror A) and fetches the set through a forward proxy, a refusing or absent proxy is said
so without its password, the OIDC provider is asked through it; while HTTPS_PROXY, HTTP_PROXY
and ALL_PROXY name the proxy, a copy between control planes, the router's engine client and
the etcd client still go straight."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.config import Oidc
from llmgw.proxy import Route
from llmgwd.mirror import hub_client
from llmgwd.mirror.hub_client import HubError
from llmgwd.people.oidc import Provider, SignInError
from llmgwd.router.engine_client import EngineClient
from llmgwd.store.etcd_http import EtcdHttp
from tests.llmgw.forward_proxy import ForwardProxy
from tests.llmgwd.mirror import test_fleet, test_mirror
from tests.llmgwd.mirror.test_mirror import REPO, Site

SECRET = "pr0xy-s3cret"
three = test_fleet.three  # the fixture: three control planes' mirrors and their hub


@pytest.fixture
async def forward() -> AsyncIterator[ForwardProxy]:
    p = ForwardProxy()
    await p.start()
    yield p
    await p.close()


@pytest.fixture
async def sites(tmp_path: Path) -> AsyncIterator[tuple[Site, Site]]:
    a = await test_mirror._site(tmp_path / "a")
    b = await test_mirror._site(tmp_path / "b", upstream=a.hf)
    yield a, b
    for s in (b, a):
        await s.session.close()
        await s.mirror.close()
        await s.server.close()


def _through(b: Site, proxy_url: str) -> None:
    """B's network.proxy set to proxy_url."""
    b.mirror.settings = dataclasses.replace(b.mirror.settings, route=Route(proxy_url, proxy_url))


def _with_password(url: str) -> str:
    return url.replace("http://", f"http://hub-user:{SECRET}@")


async def test_the_mirror_resolves_and_fetches_through_the_proxy(
    sites: tuple[Site, Site], forward: ForwardProxy
) -> None:
    a, b = sites
    await test_mirror._import(a)
    _through(b, _with_password(forward.url))
    body = {"name": "tiny", "engine": "llama.cpp", "source": f"hf:{REPO}@main:*Q4_1.gguf"}
    status, m = await b.call("POST", "/models", body)
    assert status == 201, m
    m = await test_mirror._fetched(b, "tiny")
    assert m["mirror"] is None or m["mirror"]["state"] == "done"
    paths = [t.removeprefix(a.hf) for t in forward.targets()]
    assert paths[0] == f"/api/models/{REPO}/revision/main"
    assert paths[1].startswith(f"/api/models/{REPO}/tree/")
    assert paths[2].startswith(f"/{REPO}/resolve/") and paths[2].endswith("/tiny-Q4_1.gguf")
    assert all(t.startswith(a.hf) for t in forward.targets())


@pytest.mark.parametrize("refusal", [403, 407])
async def test_a_proxy_refusing_the_hub_is_named_without_its_password(
    sites: tuple[Site, Site], forward: ForwardProxy, refusal: int
) -> None:
    a, b = sites
    await test_mirror._import(a)
    forward.refuse = refusal
    _through(b, _with_password(forward.url))
    body = {"name": "tiny", "engine": "llama.cpp", "source": f"hf:{REPO}@main:*Q4_1.gguf"}
    status, out = await b.call("POST", "/models", body)
    assert status >= 400
    shown = forward.url.replace("http://", "http://****@")
    assert f"answered {refusal}" in str(out) and f"(through proxy {shown})" in str(out)
    if refusal == 407:
        assert "the proxy wants other credentials (network.proxy's user and password)" in str(out)
    assert SECRET not in str(out)


async def test_a_proxy_that_cannot_be_reached_is_said_so() -> None:
    closed = ForwardProxy()
    await closed.start()
    await closed.close()
    route = Route("", _with_password(closed.url))
    async with aiohttp.ClientSession() as s:
        with pytest.raises(HubError) as e:
            await hub_client.resolve(s, "http://hub.site/hf", REPO, "main", route=route, tries=1)
    shown = closed.url.replace("http://", "http://****@")
    assert f"hf:{REPO}: proxy {shown} cannot be reached (to hub.site)" in str(e.value)
    assert SECRET not in str(e.value)


async def test_oidc_discovery_goes_through_the_proxy(forward: ForwardProxy) -> None:
    app = web.Application()
    server = TestServer(app, host="127.0.0.1")
    issuer = ""  # once the server has its port

    async def discovery(_: web.Request) -> web.Response:
        return web.json_response({"issuer": issuer, "jwks_uri": issuer + "/jwks"})

    app.router.add_get("/.well-known/openid-configuration", discovery)
    await server.start_server()
    issuer = str(server.make_url("")).rstrip("/")
    try:
        provider = Provider(Oidc(issuer=issuer, client_id="llmgw"), Route("", forward.url))
        assert (await provider.metadata())["issuer"] == issuer
    finally:
        await server.close()
    assert forward.targets() == [issuer + "/.well-known/openid-configuration"]


async def test_a_proxy_refusing_the_oidc_provider_is_said_so(forward: ForwardProxy) -> None:
    forward.refuse = 403
    route = Route(_with_password(forward.url), "")
    provider = Provider(Oidc(issuer="https://idp.example", client_id="llmgw"), route)
    with pytest.raises(SignInError) as e:
        await provider.metadata()
    shown = forward.url.replace("http://", "http://****@")
    assert f"proxy {shown} refused the connection to idp.example: 403" in str(e.value)
    assert SECRET not in str(e.value)


@pytest.fixture
def proxy_env(forward: ForwardProxy, monkeypatch: pytest.MonkeyPatch) -> ForwardProxy:
    """Every proxy variable of the environment names the forward proxy."""
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.setenv(name, forward.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    return forward


async def test_control_planes_copy_from_each_other_straight_and_the_hub_through_the_proxy(
    three: test_fleet.Cluster, proxy_env: ForwardProxy
) -> None:
    route = Route(proxy_env.url, proxy_env.url)
    for p in three.planes:
        p.mirror.settings = dataclasses.replace(p.mirror.settings, route=route)
    cp1, cp2, cp3 = three.planes
    cp1.mirror.fetch(test_fleet.SOURCE, test_fleet.FILES)
    await test_fleet.until(cp1.holds)
    for p in (cp2, cp3):
        p.mirror.fetch(test_fleet.SOURCE, test_fleet.FILES)
    await test_fleet.until(lambda: all(p.holds() for p in three.planes))
    hub = three.upstream.url
    assert sorted(proxy_env.targets()) == sorted(
        f"{hub}/{test_fleet.REPO}/resolve/{test_fleet.COMMIT}/{f.path}" for f in test_fleet.FILES
    )  # the hub's two files, once; no control plane's cluster port
    assert three.upstream.requests == {"model.safetensors": 1, "config.json": 1}


async def test_engines_and_etcd_are_reached_straight_whatever_the_environment(
    proxy_env: ForwardProxy,
) -> None:
    asked: list[str] = []

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        asked.append(head.split(b" ")[1].decode())
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(engine, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = EngineClient(connect_timeout_s=1.0, read_timeout_s=5.0, keepalive_s=1.0)
    try:
        answer = await client.post(f"http://127.0.0.1:{port}", "/v1/chat/completions", {}, b"{}")
        assert answer.status == 200 and await answer.read() == b"{}"
        answer.close()
    finally:
        await client.close()
        server.close()

    async def kv_range(_: web.Request) -> web.Response:
        asked.append("/v3/kv/range")
        return web.json_response({"header": {}})

    app = web.Application()
    app.router.add_post("/v3/kv/range", kv_range)
    etcd_side = TestServer(app, host="127.0.0.1")
    await etcd_side.start_server()
    etcd = EtcdHttp(str(etcd_side.make_url("")))
    try:
        assert await etcd.call("/v3/kv/range", {"key": "eA=="}) == {"header": {}}
    finally:
        await etcd.close()
        await etcd_side.close()
    assert asked == ["/v1/chat/completions", "/v3/kv/range"]
    assert proxy_env.seen == []
