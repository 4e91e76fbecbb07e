"""The etcd client never waits for ever on a member that accepts a request and never answers."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd.store import etcd
from llmgwd.store.etcd import EtcdStore
from llmgwd.store.etcd_http import EtcdHttp, EtcdUnavailable


async def _hang(request: web.Request) -> web.StreamResponse:
    """A member that took the request and answers nothing (stopped, or cut off mid-answer)."""
    response = web.StreamResponse()
    await response.prepare(request)
    await asyncio.sleep(3600)
    return response


async def test_a_keepalive_a_member_never_answers_fails_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hung keepalive would hold whoever renews (the allotments' lease has no timeout of its
    own) until the connection breaks, which may be never."""
    app = web.Application()
    app.router.add_post("/v3/lease/keepalive", _hang)
    server = TestServer(app)
    await server.start_server()
    monkeypatch.setattr(etcd, "KEEPALIVE_TIMEOUT_S", 0.2)
    store = EtcdStore(EtcdHttp(str(server.make_url(""))))
    try:
        with pytest.raises(EtcdUnavailable):
            await asyncio.wait_for(store.lease_keepalive(7), 10)
    finally:
        await store.close()
        await server.close()
