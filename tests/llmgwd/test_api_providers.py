"""POST /api/v1/providers: the credential taken only where it stays off the network (TLS, the
Unix socket, loopback); the upstream's URL https:// (http:// on loopback only), never a
link-local or cloud metadata address."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from llmgw.errors import ApiError
from llmgwd import auth
from llmgwd.api import providers as providers_route
from llmgwd.api.base import CTX
from llmgwd.auth import Principal

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
