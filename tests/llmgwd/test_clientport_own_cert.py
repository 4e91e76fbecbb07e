"""The client port with no certificate configured: llmgwd's own, from the cluster CA, for the
host's names and addresses, beside plain HTTP on the same port, renewed when due; a site's own
certificate still wins; and `llmgw context add` pins the cluster CA a person confirmed."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner, Result
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from llmgw import pki
from llmgw.cli import https
from llmgw.cli.main import main
from llmgw.config import ServerConfig
from llmgwd.clientport import own_cert
from tests.llmgwd.test_clientport import llmgwd, tls_files


def _sans(der: bytes) -> list[str]:
    cert = x509.load_der_x509_certificate(der)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(n.value) for n in san]


async def test_the_client_port_serves_a_cluster_ca_certificate_and_plain_http(
    tmp_path: Path,
) -> None:
    async with llmgwd(tmp_path, public_url="https://gw.example.org:8443") as port:
        ca = (tmp_path / "state" / "pki" / "ca.pem").read_bytes()
        trust = ssl.create_default_context(cadata=ca.decode())  # the cluster CA alone
        async with aiohttp.ClientSession() as s:
            for url in (f"https://127.0.0.1:{port.port}", f"http://127.0.0.1:{port.port}"):
                async with s.get(url + "/v1/models", ssl=trust) as r:
                    assert (r.status, r.headers["Server"]) == (401, "llmgw"), url
        chain = await asyncio.to_thread(https.offered_chain, f"https://127.0.0.1:{port.port}")
    assert https.fingerprint(chain[-1]) == pki.ca_fingerprint(ca)  # the CA a client pins
    sans = _sans(chain[0])
    for name in ("localhost", socket.gethostname(), "127.0.0.1", "gw.example.org"):
        assert name in sans
    assert set(own_cert.ipv4_addresses()) <= set(sans)


async def test_a_site_certificate_wins_and_is_tls_only(tmp_path: Path) -> None:
    tls, trust = tls_files(tmp_path)
    async with llmgwd(tmp_path, **tls) as port, aiohttp.ClientSession() as s:
        async with s.get(f"https://127.0.0.1:{port.port}/v1/models", ssl=trust) as r:
            assert r.status == 401
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
    assert not answer.startswith(b"HTTP/1.1 401")  # no plain HTTP beside the site's TLS
    assert not (tmp_path / "state" / "pki" / "client.pem").exists()


async def test_plain_http_false_makes_the_own_certificate_port_tls_only(tmp_path: Path) -> None:
    async with llmgwd(tmp_path, plain_http=False) as port:
        ca = (tmp_path / "state" / "pki" / "ca.pem").read_bytes()
        trust = ssl.create_default_context(cadata=ca.decode())
        url = f"https://127.0.0.1:{port.port}/v1/models"
        async with aiohttp.ClientSession() as s, s.get(url, ssl=trust) as r:
            assert (r.status, r.headers["Server"]) == (401, "llmgw")
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
    assert not answer.startswith(b"HTTP/1.1")  # no plain HTTP answered on the port


async def test_the_certificate_is_made_again_when_due(tmp_path: Path) -> None:
    ca = pki.make_ca()
    names: list[str] = ["a.example"]
    own = own_cert.OwnCert(ca, tmp_path, lambda: (list(names), ["192.0.2.7"]))
    tls = own.load()
    first = pki.serial_of(own.cert_file.read_bytes())
    assert not own.due() and not await own.renew()
    names.append("b.example")  # the host got another name: a certificate for it
    assert own.due() and await own.renew() and own.tls is tls
    second = own.cert_file.read_bytes()
    assert pki.serial_of(second) != first
    leaf = x509.load_pem_x509_certificate(second)  # the first of the chain
    assert "b.example" in _sans(leaf.public_bytes(serialization.Encoding.DER))
    ending = pki.make_server_cert(ca, names, ["192.0.2.7"], days=0)  # past two thirds of it
    pki.write_pem(own.cert_file, ending.cert_pem + ca.cert_pem)
    assert own.due() and await own.renew()
    assert pki.validity(own.cert_file.read_bytes())[1] > pki.validity(ending.cert_pem)[1]
    own.ca = pki.make_ca()  # another CA (a restored state dir): one of its own
    assert own.due()


async def test_a_renewal_whose_dns_lookup_hangs_does_not_stall_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = ServerConfig(state_dir=str(tmp_path))
    own = own_cert.OwnCert(pki.make_ca(), tmp_path, lambda: own_cert.host_sans(cfg))
    own.load()

    def getfqdn(name: str = "") -> str:  # DNS down: the resolver's timeout, then a new name
        time.sleep(1.0)
        return "renamed.example"

    monkeypatch.setattr(socket, "getfqdn", getfqdn)
    monkeypatch.setattr(own_cert, "CHECK_S", 0.0)  # looked at now, not in an hour
    loop = asyncio.get_running_loop()
    fired: asyncio.Future[float] = loop.create_future()
    renewing = asyncio.create_task(own.run())
    await asyncio.sleep(0)  # it starts, then looks at once
    start = loop.time()
    loop.call_later(0.01, lambda: fired.set_result(loop.time()))
    try:
        assert await fired - start < 0.1  # the loop's timers fire while the lookup waits
        for _ in range(300):  # and the certificate is made again, for the new name
            leaf = x509.load_pem_x509_certificate(own.cert_file.read_bytes())
            if "renamed.example" in _sans(leaf.public_bytes(serialization.Encoding.DER)):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the certificate was not made again")
    finally:
        renewing.cancel()


def _cli(env: dict[str, str], *args: str, given: str = "") -> Result:
    return CliRunner().invoke(main, list(args), env=env, input=given)


async def test_context_add_shows_the_cluster_ca_and_pins_it_once_confirmed(
    tmp_path: Path,
) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    async with llmgwd(tmp_path) as port:
        url = f"https://127.0.0.1:{port.port}"
        fingerprint = pki.ca_fingerprint((tmp_path / "state" / "pki" / "ca.pem").read_bytes())
        r = await asyncio.to_thread(_cli, env, "--socket", str(tmp_path / "llmgwd.sock"), "status")
        assert f"CA sha256: {fingerprint}" in r.stdout, r.output
        r = await asyncio.to_thread(_cli, env, "context", "add", "gw", url, given="n\n")
        assert r.exit_code == 1 and f"sha256 {fingerprint}" in r.stderr
        assert "nothing saved" in r.stderr
        assert not (tmp_path / "config" / "llmgw" / "contexts.yaml").exists()
        r = await asyncio.to_thread(_cli, env, "context", "add", "gw", url, given="y\n")
        assert r.exit_code == 0, r.output
        r = await asyncio.to_thread(_cli, env, "context", "add", "pinned", url,
                                    "--ca-fingerprint", fingerprint)  # fmt: skip
        assert r.exit_code == 0, r.output
        r = await asyncio.to_thread(_cli, env, "--context", "gw", "models")
        assert r.exit_code == 1 and "API key" in r.stderr  # TLS trusted; no key sent yet
    listed = json.loads(_cli(env, "context", "list", "--json").stdout)
    assert [c["ca_fingerprint"] for c in listed] == [fingerprint, fingerprint]


def test_the_sans_are_the_hosts_and_the_public_urls() -> None:
    cfg = ServerConfig()
    cfg.client.public_url = "https://203.0.113.9:7700"
    names, ips = own_cert.host_sans(cfg)
    assert "localhost" in names and socket.gethostname() in names
    assert {"127.0.0.1", "::1", "203.0.113.9"} <= set(ips)
