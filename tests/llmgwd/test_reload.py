"""`systemctl reload llmgwd`: the client port's certificate read again. A new TLS client sees
the new certificate while a keep-alive connection opened before goes on answering; files that
cannot be used keep the old certificate, said once in the log without a byte of the key."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509

from llmgw import entry, pki
from llmgw.config import ClientPort, ClusterPort, ServerConfig
from llmgwd.clientport import listener, reload
from llmgwd.daemon import Daemon

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@asynccontextmanager
async def tls_port(settings: ClientPort) -> AsyncIterator[tuple[listener.ClientServer, int]]:
    """The client port serving GET /hello with settings' certificate."""

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/hello", hello)
    runner = await listener.serve(app, settings, "127.0.0.1", 0)
    assert isinstance(runner.server, listener.ClientServer)
    try:
        yield runner.server, runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def connect(port: int, trust: ssl.SSLContext) -> tuple[Conn, str]:
    """A TLS connection and the serial of the certificate the server showed."""
    conn = await asyncio.open_connection("127.0.0.1", port, ssl=trust)
    der = conn[1].get_extra_info("ssl_object").getpeercert(binary_form=True)
    return conn, format(x509.load_der_x509_certificate(der).serial_number, "x")


async def hello(conn: Conn) -> bytes:
    """GET /hello on a kept-alive connection: the answer's status line."""
    reader, writer = conn
    writer.write(b"GET /hello HTTP/1.1\r\nHost: llmgw\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    await reader.readexactly(len(b"hello"))
    return head.split(b"\r\n")[0]


def issue(ca: pki.CertKey, cert: Path, key: Path) -> str:
    """A new certificate and key for 127.0.0.1 written over the files: its serial."""
    pair = pki.make_server_cert(ca)
    pki.write_pair(pair, cert, key)
    return pki.serial_of(pair.cert_pem)


async def test_reload_gives_new_handshakes_the_new_certificate_and_keeps_open_connections(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca, cert, key = pki.make_ca(), tmp_path / "tls.crt", tmp_path / "tls.key"
    old = issue(ca, cert, key)
    trust = ssl.create_default_context(cadata=ca.cert_pem.decode())
    config = ServerConfig(client=ClientPort(tls_cert=str(cert), tls_key=str(key)))
    async with tls_port(config.client) as (server, port):
        before, serial = await connect(port, trust)
        assert serial == old and await hello(before) == b"HTTP/1.1 200 OK"
        new = issue(ca, cert, key)  # what an ACME client's renewal does
        assert reload.reload(server, config, lambda: config)
        after, serial = await connect(port, trust)
        assert serial == new and await hello(after) == b"HTTP/1.1 200 OK"
        assert await hello(before) == b"HTTP/1.1 200 OK"  # the open connection still answers
        bad_key = key.read_text()
        for broken in ("not a certificate\n", pki.make_server_cert(ca).cert_pem.decode()):
            cert.write_text(broken)  # garbage, then a certificate whose key is not the file's
            caplog.clear()
            with caplog.at_level(logging.INFO):
                assert not reload.reload(server, config, lambda: config)
            warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(warned) == 1 and "the one loaded before is kept" in warned[0]
            assert "PRIVATE KEY" not in caplog.text and bad_key[40:80] not in caplog.text
            third, serial = await connect(port, trust)
            assert serial == new and await hello(third) == b"HTTP/1.1 200 OK"
            third[1].close()
        for _, writer in (before, after):
            writer.close()


async def test_llmgwd_reload_reads_server_yaml_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ca, cert, key = pki.make_ca(), tmp_path / "tls.crt", tmp_path / "tls.key"
    issue(ca, cert, key)
    yaml = tmp_path / "server.yaml"
    monkeypatch.setitem(entry._SOURCE, "config", (yaml, False))
    client = ClientPort(listen="127.0.0.1:0", tls_cert=str(cert), tls_key=str(key))
    cluster = ClusterPort(listen="127.0.0.1:0", advertise="https://127.0.0.1:17710")
    config = ServerConfig(state_dir=str(tmp_path / "state"), socket=str(tmp_path / "sock"),
                          client=client, cluster=cluster)  # fmt: skip
    daemon = Daemon(config)
    await daemon.start()
    try:
        port = daemon.client_runner.addresses[0][1]
        yaml.write_text(
            f"state_dir: {config.state_dir}\nsocket: {config.socket}\nname: renamed\n"
            f"client:\n  listen: 127.0.0.1:0\n  tls_cert: {cert}\n  tls_key: {key}\n"
            "  max_connections_per_address: 3\n"
            "cluster:\n  listen: 127.0.0.1:0\n  advertise: https://127.0.0.1:17710\n"
        )
        new = issue(ca, cert, key)
        with caplog.at_level(logging.INFO):
            daemon.reload()
        assert "in force only after a restart: name" in caplog.text
        trust = ssl.create_default_context(cadata=ca.cert_pem.decode())
        (_, writer), serial = await connect(port, trust)
        assert serial == new
        writer.close()
        server = daemon.client_runner.server
        assert isinstance(server, listener.ClientServer) and server.gate.cap == 3
    finally:
        await daemon.stop()


def test_llmgwd_service_reloads_by_sighup() -> None:
    unit = Path(__file__).parents[2] / "units" / "llmgwd.service"
    lines = unit.read_text().splitlines()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in lines and "Type=notify" in lines
