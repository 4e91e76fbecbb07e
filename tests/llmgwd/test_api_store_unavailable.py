"""/api/v1 while the store cannot answer (etcd without quorum, its leader changing): a 503
store_unavailable that says so and when to ask again, not a bare 500 with a traceback."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgwd.api.base import errors_middleware
from llmgwd.store import StoreUnavailable
from llmgwd.store.etcd_http import EtcdError, _raise_for


@pytest.mark.parametrize(
    ("answer", "unavailable"),
    [
        ({"error": "etcdserver: leader changed", "code": 14}, True),
        ({"error": "etcdserver: request timed out", "code": 4}, True),
        ({"error": {"grpc_code": 14, "message": "etcdserver: no leader"}, "grpc_code": 14}, True),
        ({"error": "etcdserver: key is not provided", "code": 3}, False),
    ],
)
def test_etcd_busy_answers_are_store_unavailable(
    answer: dict[str, object], unavailable: bool
) -> None:
    with pytest.raises(EtcdError) as caught:
        _raise_for(answer)
    assert isinstance(caught.value, StoreUnavailable) is unavailable


async def test_a_write_the_store_cannot_take_is_a_503(caplog: pytest.LogCaptureFixture) -> None:
    async def handler(_request: web.Request) -> web.Response:
        _raise_for({"error": "etcdserver: leader changed", "code": 14})
        return web.Response()

    app = web.Application(middlewares=[errors_middleware])
    app.router.add_post("/keys", handler)
    async with TestClient(TestServer(app)) as client:
        with caplog.at_level(logging.WARNING):
            resp = await client.post("/keys", json={"name": "k"})
            body = await resp.json()
    assert resp.status == 503 and resp.headers["Retry-After"] == "2"
    assert body["error"]["code"] == "store_unavailable"
    assert "ask again" in body["error"]["message"]
    records = [r for r in caplog.records if "store is unavailable" in r.getMessage()]
    assert len(records) == 1 and records[0].exc_info is None  # one line, no traceback
