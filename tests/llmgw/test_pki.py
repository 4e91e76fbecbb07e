"""The cluster PKI: CA files, server and node certificates, join tokens, TLS contexts."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ipaddress
import re
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from llmgw import pki


@pytest.fixture(scope="module")
def ca() -> pki.CertKey:
    return pki.make_ca("test")


def _eku(cert_pem: bytes) -> list[x509.ObjectIdentifier]:
    cert = x509.load_pem_x509_certificate(cert_pem)
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_ca_is_written_with_a_private_key_and_read_back(ca: pki.CertKey, tmp_path: Path) -> None:
    pki.write_pair(ca, tmp_path / "ca.pem", tmp_path / "ca.key")

    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    assert pki.read_pair(tmp_path / "ca.pem", tmp_path / "ca.key") == ca
    pki.check_ca(ca.cert_pem)
    cert = x509.load_pem_x509_certificate(ca.cert_pem)
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime.days >= 3650


def test_fingerprint_is_sha256_of_der(ca: pki.CertKey) -> None:
    der = x509.load_pem_x509_certificate(ca.cert_pem).public_bytes(serialization.Encoding.DER)
    assert pki.ca_fingerprint(ca.cert_pem) == hashlib.sha256(der).hexdigest()


def test_server_cert_names_the_given_hosts_and_localhost(ca: pki.CertKey) -> None:
    server = pki.make_server_cert(ca, ["cp1.example"], ["10.1.2.3"])

    cert = x509.load_pem_x509_certificate(server.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"cp1.example", "localhost"}
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("10.1.2.3"),
        ipaddress.ip_address("127.0.0.1"),
    }
    assert _eku(server.cert_pem) == [ExtendedKeyUsageOID.SERVER_AUTH]


def test_node_cert_is_for_client_auth_only(ca: pki.CertKey) -> None:
    key_pem, csr_pem = pki.make_node_csr("gpu-01")

    cert_pem = pki.sign_csr(ca, csr_pem, "gpu-01")

    assert pki.common_name(cert_pem) == "gpu-01"
    assert _eku(cert_pem) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    pki.check_node_cert(cert_pem, ca.cert_pem, "gpu-01", key_pem)
    with pytest.raises(pki.PKIError):
        pki.check_ca(cert_pem)


def test_csr_for_another_node_is_not_signed(ca: pki.CertKey) -> None:
    _, csr_pem = pki.make_node_csr("node-a")

    with pytest.raises(pki.PKIError, match="common name"):
        pki.sign_csr(ca, csr_pem, "node-b")


@pytest.mark.parametrize("name", ["", "-x", "a b", "a/b", "x" * 64])
def test_bad_node_names_are_refused(name: str) -> None:
    with pytest.raises(pki.PKIError):
        pki.make_node_csr(name)


def test_join_token_carries_the_ca_hash(ca: pki.CertKey) -> None:
    token = pki.new_join_token(ca.cert_pem)

    ca_hash, secret = pki.split_join_token(token)
    assert ca_hash == pki.ca_fingerprint(ca.cert_pem)[:32]
    assert len(secret) >= 40 and re.fullmatch(r"[A-Za-z0-9_-]+", secret)
    assert pki.token_matches_ca(token, ca.cert_pem)
    assert not pki.token_matches_ca(token, pki.make_ca("other").cert_pem)
    assert pki.new_join_token(ca.cert_pem) != token


def test_malformed_token_error_does_not_echo_it() -> None:
    with pytest.raises(pki.PKIError) as e:
        pki.split_join_token("not-a-token-s3cr3t")
    assert "s3cr3t" not in str(e.value)


async def test_server_requiring_client_certs_takes_only_the_cas(
    ca: pki.CertKey, tmp_path: Path
) -> None:
    pki.write_pair(pki.make_server_cert(ca), tmp_path / "s.pem", tmp_path / "s.key")
    key_pem, csr_pem = pki.make_node_csr("n1")
    pki.write_pem(tmp_path / "n.key", key_pem, private=True)
    pki.write_pem(tmp_path / "n.pem", pki.sign_csr(ca, csr_pem, "n1"))
    server_ctx = pki.server_context(ca.cert_pem, tmp_path / "s.pem", tmp_path / "s.key")
    seen: list[str | None] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        seen.append(pki.node_name_of(der))
        writer.write(b"ok")
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    async with server:
        with_cert = pki.client_context(ca.cert_pem, tmp_path / "n.pem", tmp_path / "n.key")
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=with_cert)
        assert await reader.read() == b"ok"
        writer.close()

        without = pki.client_context(ca.cert_pem)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=without)
            if not await reader.read():  # TLS 1.3: the refusal arrives after the handshake
                raise ConnectionError("closed")
    assert seen == ["n1"]


def test_node_certificates_are_short_lived_and_due_at_two_thirds(ca: pki.CertKey) -> None:
    _, csr_pem = pki.make_node_csr("n1")
    cert_pem = pki.sign_csr(ca, csr_pem, "n1")
    start, end = pki.validity(cert_pem)
    assert datetime.timedelta(days=29) < end - start <= datetime.timedelta(days=30, minutes=5)
    due = pki.renew_at(cert_pem)
    assert start + (end - start) * 0.6 < due < start + (end - start) * 0.7
    # A five-year certificate from an older llmgw is due as if it were a 30-day one.
    _, csr_pem = pki.make_node_csr("n2")
    old = pki.sign_csr(ca, csr_pem, "n2", days=1825)
    assert pki.renew_at(old) - pki.validity(old)[0] == due - start


def test_a_renewal_csr_keeps_the_nodes_key(ca: pki.CertKey) -> None:
    key_pem, csr_pem = pki.make_node_csr("n1")
    first = pki.sign_csr(ca, csr_pem, "n1")
    second = pki.sign_csr(ca, pki.node_csr("n1", key_pem), "n1")
    pki.check_node_cert(second, ca.cert_pem, "n1", key_pem)
    assert pki.serial_of(first) != pki.serial_of(second)
    der = x509.load_pem_x509_certificate(second).public_bytes(serialization.Encoding.DER)
    assert pki.node_identity(der) == pki.NodeIdentity("n1", pki.serial_of(second))
