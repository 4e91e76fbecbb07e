"""A new control plane's token and join: POST /servers/join on the cluster port hands out the
CA key and the cluster secret for a live plane token only, and adds the etcd member."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from llmgw import pki, wire
from llmgwd.catalog import Catalog, JoinToken, hash_secret
from llmgwd.planes import tokens
from llmgwd.planes.join import Joining, add_route
from llmgwd.planes.tokens import PlaneTokens
from llmgwd.store import Store
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.fake_etcd import FakeEtcd

SECRET = b"s" * 32
CA = pki.make_ca("test")


@dataclass
class Port:
    url: str
    store: Store
    tokens: PlaneTokens
    etcd: FakeEtcd


@pytest.fixture
async def port() -> AsyncIterator[Port]:
    store = await SqliteStore.open(":memory:")
    tokens = PlaneTokens(store, CA.cert_pem)
    etcd = FakeEtcd()
    app = web.Application(client_max_size=64 << 10)
    add_route(app, Joining(tokens, etcd, CA, SECRET, "lab"))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield Port(str(server.make_url("/servers/join")), store, tokens, etcd)
    await server.close()
    await store.close()


async def _join(url: str, body: object) -> tuple[int, bytes]:
    async with ClientSession() as s, s.post(url, json=body) as r:
        return r.status, await r.read()


def _request(token: str, name: str = "cp2", peer: str = "https://10.0.0.2:7721") -> dict[str, str]:
    return {"token": token, "name": name, "peer_url": peer}


def _leaks(body: bytes) -> bool:
    """Whether an answer holds anything of the cluster's secrets or members."""
    return any(
        part in body
        for part in (CA.key_pem[30:60], base64.b64encode(SECRET), b"cp1", b"10.0.0.1", b"BEGIN")
    )


async def test_a_plane_token_buys_the_ca_key_secret_and_a_member(port: Port) -> None:
    token = await port.tokens.mint()
    status, body = await _join(port.url, _request(token))
    assert status == 200, body
    answer = msgspec.json.decode(body, type=wire.PlaneJoinResponse)
    assert answer.ca_key_pem.encode() == CA.key_pem and answer.ca_pem.encode() == CA.cert_pem
    assert base64.b64decode(answer.secret) == SECRET and answer.cluster == "lab"
    assert answer.members == [
        wire.EtcdMember("cp1", ["https://10.0.0.1:7721"]),
        wire.EtcdMember("cp2", ["https://10.0.0.2:7721"]),
    ]
    assert [m.peer_urls for m in port.etcd.members_][-1] == ["https://10.0.0.2:7721"]
    assert port.etcd.members_[-1].learner  # no vote (no quorum of its own) until promoted


async def _refused(port: Port, token: str) -> None:
    before = list(port.etcd.members_)
    status, body = await _join(port.url, _request(token))
    assert status == 403, body
    assert b"invalid, expired or already used" in body and not _leaks(body)
    assert port.etcd.members_ == before  # no member added


async def test_no_token_a_node_token_a_used_or_expired_one_get_nothing(port: Port) -> None:
    await _refused(port, "")
    await _refused(port, pki.new_join_token(CA.cert_pem))  # right CA, never made
    node_token = pki.new_join_token(CA.cert_pem)
    await Catalog(port.store).add_token(node_token, 600)
    await _refused(port, node_token)
    used = await port.tokens.mint()
    assert (await _join(port.url, _request(used)))[0] == 200
    await _refused(port, used)
    expired = pki.new_join_token(CA.cert_pem)
    rec = JoinToken(hash=hash_secret(expired), expires_at=time.time() - 1)
    await port.store.put(tokens.PREFIX + rec.hash, msgspec.json.encode(rec))
    await _refused(port, expired)
    status, body = await _join(port.url, {"name": "cp9"})
    assert status == 400 and not _leaks(body)


async def test_a_plane_token_is_no_node_token(port: Port) -> None:
    token = await port.tokens.mint()
    assert not await Catalog(port.store).consume_token(token)
    assert (await _join(port.url, _request(token)))[0] == 200  # and it was not spent there


async def test_a_member_name_is_refused_and_the_token_kept(port: Port) -> None:
    token = await port.tokens.mint()
    status, body = await _join(port.url, _request(token, name="cp1"))
    assert status == 409 and b"already a member" in body
    status, body = await _join(port.url, _request(token, peer="https://10.0.0.1:7721"))
    assert status == 409
    assert (await _join(port.url, _request(token)))[0] == 200


async def test_a_bad_name_or_peer_url_is_a_400(port: Port) -> None:
    token = await port.tokens.mint()
    assert (await _join(port.url, _request(token, name="a/b")))[0] == 400
    assert (await _join(port.url, _request(token, peer="http://10.0.0.2:7721")))[0] == 400
    assert (await _join(port.url, _request(token, peer="https://x:1; rm")))[0] == 400
    assert await port.tokens.valid(token)  # none of them spent it


async def test_one_joins_at_a_time_the_next_after_its_promotion(port: Port) -> None:
    first, second = await port.tokens.mint(), await port.tokens.mint()
    assert (await _join(port.url, _request(first)))[0] == 200
    status, body = await _join(port.url, _request(second, "cp3", "https://10.0.0.3:7721"))
    assert status == 409 and b"another control plane is joining" in body, body
    assert len(port.etcd.members_) == 2 and await port.tokens.valid(second)
    assert await port.etcd.promote(2)
    assert (await _join(port.url, _request(second, "cp3", "https://10.0.0.3:7721")))[0] == 200


async def test_etcd_not_ready_for_a_member_is_a_503_keeping_the_token(port: Port) -> None:
    token = await port.tokens.mint()
    port.etcd.unready = True
    status, body = await _join(port.url, _request(token))
    assert status == 503 and b"unhealthy cluster" in body and not _leaks(body), body
    assert len(port.etcd.members_) == 1 and await port.tokens.valid(token)
    port.etcd.unready = False
    assert (await _join(port.url, _request(token)))[0] == 200
