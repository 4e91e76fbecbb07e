"""POST /api/v1/providers: the credential taken only where it stays off the network (TLS, the
Unix socket, loopback); the upstream's URL https:// (http:// on loopback only), never a
link-local or cloud metadata address."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any
from unittest import mock

import msgspec
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.test_utils import make_mocked_request

from llmgw.api_types import ProviderIn
from llmgw.errors import ApiError
from llmgwd import auth
from llmgwd.api import providers as providers_route
from llmgwd.api.base import CTX
from llmgwd.auth import Principal
from llmgwd.providers.addresses import GuardedResolver

CREDENTIAL = "sk-provider-credential-SEKRIT-0123456789"


def _request(peer: tuple[str, int], ctx: Any) -> web.Request:
    extra = {"peername": peer, "socket": mock.Mock(family=socket.AF_INET), "sslcontext": None}
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: extra.get(name, default)
    app = web.Application()
    app[CTX] = ctx
    req = make_mocked_request("POST", "/api/v1/providers", app=app, transport=transport)
    req[auth.PRINCIPAL] = Principal("key k1 (ops)", staff="admin")
    return req


async def test_plain_http_from_the_network_is_refused_before_the_credential_is_read() -> None:
    ctx = SimpleNamespace(credentials=mock.Mock(), catalog=mock.AsyncMock())
    with pytest.raises(ApiError) as e:
        await providers_route.add_provider(_request(("10.1.2.3", 5000), ctx))
    assert (e.value.status, e.value.detail.code) == (403, "tls_required")
    ctx.credentials.seal.assert_not_called()
    ctx.catalog.add_model.assert_not_called()


def _body(url: str) -> bytes:
    return msgspec.json.encode({"name": "gpt", "protocol": "openai", "url": url,
                                "model": "gpt-4o-mini", "credential": CREDENTIAL})  # fmt: skip


@pytest.mark.parametrize(
    "url",
    [
        "https://api.openai.com/v1",
        "https://api.example.com:8443/v1",
        "http://127.0.0.1:8080/v1",  # a local stand-in or relay
        "http://localhost:8080/v1",
        "http://[::1]:8080/v1",
    ],
)
def test_https_or_a_loopback_http_url_is_taken(url: str) -> None:
    body = msgspec.json.decode(_body(url), type=ProviderIn)
    assert providers_route._model_of(body, "sealed").upstream is not None


@pytest.mark.parametrize(
    "url",
    [
        "http://api.openai.com/v1",  # the credential in clear
        "http://10.0.0.5:8000/v1",
        "http://169.254.169.254/latest/meta-data",
        "http://127.0.0.1.example.com/v1",
    ],
)
def test_plain_http_elsewhere_than_the_loopback_is_refused(url: str) -> None:
    with pytest.raises(msgspec.ValidationError, match="url"):
        msgspec.json.decode(_body(url), type=ProviderIn)


@pytest.mark.parametrize(
    "url",
    [
        "https://169.254.169.254/latest/meta-data",  # a cloud's metadata service
        "https://169.254.0.1:8443/v1",
        "https://[fe80::1]/v1",
        "https://[::ffff:169.254.169.254]/v1",
        "https://0.0.0.0/v1",
    ],
)
def test_a_link_local_address_is_refused(url: str) -> None:
    body = msgspec.json.decode(_body(url), type=ProviderIn)
    with pytest.raises(ApiError) as e:
        providers_route._model_of(body, "sealed")
    assert e.value.status == 400 and e.value.detail.param == "url"
    assert "link-local" in e.value.detail.message


async def test_a_name_resolving_to_a_link_local_address_is_not_connected_to() -> None:
    class Inner(AbstractResolver):
        def __init__(self, addresses: list[str]) -> None:
            self.addresses = addresses

        async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
        ) -> list[ResolveResult]:
            return [ResolveResult(hostname=host, host=a, port=port, family=family, proto=0,
                                  flags=0) for a in self.addresses]  # fmt: skip

        async def close(self) -> None:
            return None

    metadata = GuardedResolver(Inner(["169.254.169.254"]))
    with pytest.raises(OSError, match="link-local"):
        await metadata.resolve("metadata.example.com", 443)
    mixed = GuardedResolver(Inner(["fe80::1", "203.0.113.7"]))
    assert [r["host"] for r in await mixed.resolve("api.example.com", 443)] == ["203.0.113.7"]
