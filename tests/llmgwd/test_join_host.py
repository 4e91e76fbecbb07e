"""`llmgw plane join`'s side on the new host: the CA pinned by the token before the token is
sent, the answer checked, and the keys written where llmgwd reads them (0600)."""

from __future__ import annotations

import base64
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw import pki, wire
from llmgwd.nodes.port import server_ssl_context
from llmgwd.planes import join_host
from llmgwd.planes.join import Joining, add_route
from llmgwd.planes.tokens import PlaneTokens
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.fake_etcd import FakeEtcd

SECRET = b"k" * 32
CA = pki.make_ca("test")
PEER = "https://10.0.0.2:7721"


@dataclass
class Port:
    url: str
    tokens: PlaneTokens
    etcd: FakeEtcd


async def _ca(_: web.Request) -> web.Response:
    return web.Response(body=CA.cert_pem)


@pytest.fixture
async def port(tmp_path: Path) -> AsyncIterator[Port]:
    store = await SqliteStore.open(":memory:")
    tokens, etcd = PlaneTokens(store, CA.cert_pem), FakeEtcd()
    app = web.Application()
    app.router.add_get("/ca", _ca)
    add_route(app, Joining(tokens, etcd, CA, SECRET, "lab"))
    pki.write_pair(pki.make_server_cert(CA, ["localhost"], ["127.0.0.1"]),
                   tmp_path / "s.pem", tmp_path / "s.key")  # fmt: skip
    tls = server_ssl_context(CA.cert_pem, tmp_path / "s.pem", tmp_path / "s.key")
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(ssl=tls)
    yield Port(f"https://127.0.0.1:{server.port}", tokens, etcd)
    await server.close()
    await store.close()


async def test_joined_the_keys_written_for_llmgwd(port: Port, tmp_path: Path) -> None:
    token = await port.tokens.mint()
    answer = await join_host.ask(port.url, token, "cp2", PEER)
    assert answer.cluster == "lab" and wire.EtcdMember("cp2", [PEER]) in answer.members
    state = tmp_path / "state"
    join_host.write_keys(state, answer, (-1, -1))
    assert (state / "pki/ca.pem").read_bytes() == CA.cert_pem
    assert pki.read_pair(state / "pki/ca.pem", state / "pki/ca.key") == CA
    assert (state / "secret").read_bytes() == SECRET  # as daemon.load_secret reads it
    for f in ("pki/ca.key", "secret"):
        assert stat.S_IMODE((state / f).stat().st_mode) == 0o600
    assert stat.S_IMODE((state / "pki").stat().st_mode) == 0o700


async def test_another_cas_token_is_never_sent(port: Port) -> None:
    other = pki.new_join_token(pki.make_ca("other").cert_pem)
    with pytest.raises(join_host.JoinFailed, match="not the one the plane token names") as e:
        await join_host.ask(port.url, other, "cp2", PEER)
    assert other not in str(e.value) and len(port.etcd.members_) == 1


async def test_a_refusal_is_said_without_the_token(port: Port) -> None:
    token = pki.new_join_token(CA.cert_pem)  # the right CA, never minted
    with pytest.raises(join_host.JoinFailed, match="HTTP 403") as e:
        await join_host.ask(port.url, token, "cp2", PEER)
    assert token.split(".")[1] not in str(e.value)
    with pytest.raises(join_host.JoinFailed, match="malformed"):
        await join_host.ask(port.url, "nonsense", "cp2", PEER)
    with pytest.raises(join_host.JoinFailed, match="cannot reach"):
        await join_host.ask("https://127.0.0.1:1", token, "cp2", PEER)


def test_an_answer_with_a_key_not_the_cas_is_refused() -> None:
    stranger = pki.make_ca("stranger")
    body = wire.PlaneJoinResponse(CA.cert_pem.decode(), stranger.key_pem.decode(),
                                   base64.b64encode(SECRET).decode(),
                                   [wire.EtcdMember("cp2", [PEER])], "lab")  # fmt: skip
    with pytest.raises(join_host.JoinFailed, match="not the CA's") as e:
        join_host._checked(msgspec.json.encode(body), CA.cert_pem, "cp2")
    assert "PRIVATE" not in str(e.value)


async def test_a_store_not_ready_is_waited_for(port: Port, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(join_host, "RETRY_EVERY_S", 0.01)
    token = await port.tokens.mint()
    port.etcd.unready = True
    said: list[str] = []

    def retried(why: str) -> None:
        said.append(why)
        port.etcd.unready = len(said) < 3  # ready at the third try

    answer = await join_host.ask(port.url, token, "cp2", PEER, on_retry=retried)
    assert answer.cluster == "lab" and len(said) == 3 and "unhealthy cluster" in said[0]
    assert await port.etcd.promote(2)
    port.etcd.unready = True
    with pytest.raises(join_host.JoinFailed, match="HTTP 503"):
        await join_host.ask(port.url, await port.tokens.mint(), "cp3", "https://10.0.0.3:7721",
                            retry_s=0.05)  # fmt: skip
