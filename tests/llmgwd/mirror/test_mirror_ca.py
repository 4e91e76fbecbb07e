"""mirror.ca_file: a mirror whose upstream and peer is another llmgw's /hf over TLS, with a
certificate of a CA found only in that file, resolves and copies from it; without the file the
certificate is refused (the system's CAs do not know it); a file that is no CA stops the start."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw import pki, sources
from llmgw.config import ConfigError, ServerConfig
from llmgw.config import Mirror as MirrorConfig
from llmgwd.mirror import hub_server, peers, setup
from llmgwd.mirror.records import Peer, Records
from llmgwd.mirror.service import Mirror, MirrorError, Settings
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.mirror import test_mirror
from tests.llmgwd.mirror.test_mirror import FILES, REPO, Site


@dataclass
class TlsHub:
    """Mirror A's /hf over TLS, its certificate signed by a CA written to ca_file alone."""

    url: str
    ca_file: Path


@pytest.fixture
async def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[TlsHub]:
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)  # the system's CAs: never this test's CA
    a = await test_mirror._site(tmp_path / "a")
    await test_mirror._import(a)
    server = await _tls_server(a, tmp_path)
    yield TlsHub(str(server.make_url("/hf")), tmp_path / "ca.pem")
    await server.close()
    await _close(a)


async def _tls_server(a: Site, tmp: Path) -> TestServer:
    ca = pki.make_ca("mirror machine")
    (tmp / "ca.pem").write_bytes(ca.cert_pem)
    pki.write_pair(pki.make_server_cert(ca), tmp / "hub.pem", tmp / "hub.key")  # 127.0.0.1
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp / "hub.pem", tmp / "hub.key")
    hf = hub_server.hub_app(a.mirror, test_mirror.anyone)
    hf.router.add_get(peers.LISTING, peers.listing_handler(a.mirror))
    app = web.Application()
    app.add_subapp("/hf", hf)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(ssl=tls)
    return server


async def _close(a: Site) -> None:
    await a.session.close()
    await a.mirror.close()
    await a.server.close()


async def _mirror(tmp: Path, upstream: str, ca_file: str) -> Mirror:
    store = await SqliteStore.open(":memory:")
    mirror = Mirror(Settings(dir=tmp, upstream=upstream, ca_file=ca_file), Records(store))
    await mirror.start()
    return mirror


async def test_upstream_and_peer_trusted_through_ca_file(hub: TlsHub, tmp_path: Path) -> None:
    b = await _mirror(tmp_path / "b", hub.url, str(hub.ca_file))
    try:
        snap = await b.resolve(sources.parse_hf(f"hf:{REPO}@main"))
        assert {f.path for f in snap.files} == set(FILES)
        await b.records.put_peer(Peer(url=hub.url))
        await peers.sync(b, b.records.peers()[0])
        assert b.records.peers()[0].last_error == ""
        copied = b.snapshot(REPO, "main")
        assert copied is not None and copied.commit == snap.commit
        assert {b.store.path(f.sha256).read_bytes() for f in copied.files} == set(FILES.values())
    finally:
        await b.close()


async def test_without_ca_file_the_certificate_is_refused(hub: TlsHub, tmp_path: Path) -> None:
    c = await _mirror(tmp_path / "c", hub.url, "")
    try:
        with pytest.raises(MirrorError) as e:
            await c.resolve(sources.parse_hf(f"hf:{REPO}@main"))
        assert e.value.status == 502
        await c.records.put_peer(Peer(url=hub.url))
        await peers.sync(c, c.records.peers()[0])
        assert "Certificate" in c.records.peers()[0].last_error
        assert c.snapshot(REPO, "main") is None and c.store.held() == []
    finally:
        await c.close()


async def test_a_ca_file_that_is_no_ca_stops_the_start(tmp_path: Path) -> None:
    cfg = ServerConfig(mirror=MirrorConfig(ca_file=str(tmp_path / "ca.pem")))
    settings = setup.settings(cfg, tmp_path)
    assert settings.ca_file == str(tmp_path / "ca.pem")  # server.yaml's mirror.ca_file
    for text in (None, "not a certificate\n"):
        if text is not None:
            (tmp_path / "ca.pem").write_text(text)
        mirror = Mirror(settings, Records(await SqliteStore.open(":memory:")))
        with pytest.raises(ConfigError, match=r"^mirror\.ca_file .*ca\.pem: "):
            await mirror.start()
