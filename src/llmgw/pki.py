"""The cluster's own PKI: its CA, the cluster port's certificate, node certificates, join tokens."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
SERVER_DAYS = 1825
# A node certificate lasts 30 days and its agent renews it over the link at two thirds of
# that (day 20). Short, so a certificate copied off a node (a disk, a backup) is dead within
# a month without anyone removing the node; long enough that an agent down over a long
# weekend still has ten days left to renew in. Removal refuses it at once either way.
NODE_DAYS = 30
RENEW_AT = 2 / 3  # of a node certificate's life, when its agent asks for the next one
TOKEN_HASH_CHARS = 32  # 128 bits of the CA's sha256: enough to pin it, short to type

# Host-name-like, so a node name is safe in a CN, a unit name and a log line.
_NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62})")
_BACKDATE = datetime.timedelta(minutes=5)  # tolerate small clock skew between hosts
_PublicKey = ec.EllipticCurvePublicKey


class PKIError(Exception):
    """A certificate, CSR or token that cannot be used; the message never holds a secret."""


@dataclass(frozen=True, slots=True)
class CertKey:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes


# Making certificates


def make_ca(name: str = "llmgw", days: int = CA_DAYS) -> CertKey:
    """A new self-signed cluster CA (ECDSA P-256) that may sign only end-entity certs."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} cluster CA")])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    builder = (
        _base(subject, subject, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
    )
    cert = builder.sign(key, hashes.SHA256())
    return CertKey(_cert_pem(cert), _key_pem(key))


def make_server_cert(
    ca: CertKey,
    dns_names: Sequence[str] = (),
    ips: Sequence[str] = (),
    days: int = SERVER_DAYS,
) -> CertKey:
    """The cluster port's certificate: serverAuth, for the names and IPs given and localhost."""
    ca_cert, ca_key = _load_ca(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    names = _unique(["localhost", *dns_names])
    addresses = _unique(["127.0.0.1", *ips])
    cn = dns_names[0] if dns_names else "localhost"
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    san: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    try:
        san += [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    except ValueError as e:
        raise PKIError(f"not an IP address: {e}") from None
    builder = _leaf(subject, ca_cert, key.public_key(), days, ExtendedKeyUsageOID.SERVER_AUTH)
    cert = builder.add_extension(x509.SubjectAlternativeName(san), critical=False).sign(
        ca_key, hashes.SHA256()
    )
    return CertKey(_cert_pem(cert), _key_pem(key))


def make_etcd_cert(
    ca: CertKey, name: str, ips: Sequence[str] = (), days: int = SERVER_DAYS
) -> CertKey:
    """An etcd member's or etcd client's certificate: serverAuth and clientAuth, for localhost,
    127.0.0.1 and the IPs given. A member uses one for its peers and clients alike (etcd 3.4's
    own JSON gateway dials the member with it, so a server cert needs clientAuth too); llmgwd
    presents one to its member under --client-cert-auth."""
    ca_cert, ca_key = _load_ca(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    try:
        addresses = [ipaddress.ip_address(a) for a in _unique(["127.0.0.1", *ips])]
    except ValueError as e:
        raise PKIError(f"not an IP address: {e}") from None
    san: list[x509.GeneralName] = [x509.DNSName("localhost")]
    san += [x509.IPAddress(a) for a in addresses]
    usages = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = _leaf(subject, ca_cert, key.public_key(), days, *usages)
    cert = builder.add_extension(x509.SubjectAlternativeName(san), critical=False).sign(
        ca_key, hashes.SHA256()
    )
    return CertKey(_cert_pem(cert), _key_pem(key))


PLANE_ORG = "llmgw control plane"  # the O of a control plane's client certificate


def make_plane_cert(ca: CertKey, name: str, days: int = SERVER_DAYS) -> CertKey:
    """A control plane's client certificate (clientAuth, CN its name, O PLANE_ORG), made by a
    control plane with the CA key every control plane holds, to fetch another's mirror files.
    A node's certificate never carries the O: sign_csr takes only the CN from a CSR."""
    ca_cert, ca_key = _load_ca(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, PLANE_ORG),
            x509.NameAttribute(NameOID.COMMON_NAME, name),
        ]
    )
    builder = _leaf(subject, ca_cert, key.public_key(), days, ExtendedKeyUsageOID.CLIENT_AUTH)
    return CertKey(_cert_pem(builder.sign(ca_key, hashes.SHA256())), _key_pem(key))


def make_node_csr(node_name: str) -> tuple[bytes, bytes]:
    """A fresh node key and a CSR for it with CN = node name: (key PEM, CSR PEM)."""
    check_node_name(node_name)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_name)])
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    return _key_pem(key), csr.public_bytes(serialization.Encoding.PEM)


def node_csr(node_name: str, key_pem: bytes | str) -> bytes:
    """A CSR with CN = node name for an existing node key (a renewal keeps the node's key)."""
    check_node_name(node_name)
    key = serialization.load_pem_private_key(_bytes(key_pem), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PKIError("the node key is not an EC key")
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_name)])
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM)


def check_node_name(name: str) -> None:
    """Raise PKIError unless name is a host-name-like node name."""
    if not _NODE_NAME.fullmatch(name):
        raise PKIError(
            "a node name is 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )


def check_csr(csr_pem: bytes | str, node_name: str) -> x509.CertificateSigningRequest:
    """The CSR, once its signature is valid and its CN is exactly node_name."""
    check_node_name(node_name)
    try:
        csr = x509.load_pem_x509_csr(_bytes(csr_pem))
    except ValueError:
        raise PKIError("the CSR is not a PEM certificate signing request") from None
    if not csr.is_signature_valid:
        raise PKIError("the CSR's signature is not valid")
    if _common_name(csr.subject) != node_name:
        raise PKIError(f"the CSR's common name is not the node name {node_name!r}")
    return csr


def sign_csr(ca: CertKey, csr_pem: bytes | str, node_name: str, days: int = NODE_DAYS) -> bytes:
    """A node certificate (clientAuth only) for a checked CSR; the CSR's extensions are ignored."""
    csr = check_csr(csr_pem, node_name)
    ca_cert, ca_key = _load_ca(ca)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_name)])
    public_key = csr.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise PKIError("the CSR's key is not an EC key")  # all our agents make P-256 keys
    builder = _leaf(subject, ca_cert, public_key, days, ExtendedKeyUsageOID.CLIENT_AUTH)
    return _cert_pem(builder.sign(ca_key, hashes.SHA256()))


# Reading certificates


def ca_fingerprint(ca_pem: bytes | str) -> str:
    """sha256 of the CA certificate's DER, lowercase hex."""
    cert = _load_cert(ca_pem)
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def check_ca(ca_pem: bytes | str) -> None:
    """Raise PKIError unless the PEM is a CA certificate."""
    cert = _load_cert(ca_pem)
    try:
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        raise PKIError("the certificate is not a CA (no basicConstraints)") from None
    if not bc.ca:
        raise PKIError("the certificate is not a CA")


def common_name(cert_pem: bytes | str) -> str:
    """The CN of a PEM certificate ('' if none)."""
    return _common_name(_load_cert(cert_pem).subject)


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """Who a verified node certificate speaks for, and which certificate it is."""

    name: str
    serial: str  # the certificate's serial number, lowercase hex


def node_identity(cert_der: bytes) -> NodeIdentity | None:
    """The node and serial of a client certificate TLS has already verified (clientAuth)."""
    try:
        cert = x509.load_der_x509_certificate(cert_der)
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    if ExtendedKeyUsageOID.CLIENT_AUTH not in eku:
        return None
    name = _common_name(cert.subject)
    return NodeIdentity(name, _serial(cert)) if _NODE_NAME.fullmatch(name) else None


def plane_name_of(cert_der: bytes) -> str | None:
    """The control plane a client certificate TLS has already verified speaks for: its CN
    if it is a clientAuth certificate with O PLANE_ORG (make_plane_cert), else None."""
    ident = node_identity(cert_der)
    if ident is None:
        return None
    orgs = x509.load_der_x509_certificate(cert_der).subject.get_attributes_for_oid(
        NameOID.ORGANIZATION_NAME
    )
    return ident.name if [a.value for a in orgs] == [PLANE_ORG] else None


def node_name_of(cert_der: bytes) -> str | None:
    """The node name of a client certificate TLS has already verified: its CN if clientAuth."""
    ident = node_identity(cert_der)
    return ident.name if ident is not None else None


def serial_of(cert_pem: bytes | str) -> str:
    """A PEM certificate's serial number, lowercase hex."""
    return _serial(_load_cert(cert_pem))


def validity(cert_pem: bytes | str) -> tuple[datetime.datetime, datetime.datetime]:
    """When a PEM certificate starts and stops being valid (UTC)."""
    cert = _load_cert(cert_pem)
    return cert.not_valid_before_utc, cert.not_valid_after_utc


def renew_at(cert_pem: bytes | str) -> datetime.datetime:
    """When a node certificate is due for renewal: RENEW_AT of its life, and never later than
    RENEW_AT of NODE_DAYS (so a long one from an older llmgw is replaced soon)."""
    start, end = validity(cert_pem)
    life = min(end - start, datetime.timedelta(days=NODE_DAYS))
    return start + life * RENEW_AT


def check_node_cert(
    cert_pem: bytes | str, ca_pem: bytes | str, node_name: str, key_pem: bytes | str
) -> None:
    """Raise PKIError unless the cert is the CA's, for node_name, and for this key."""
    cert, ca = _load_cert(cert_pem), _load_cert(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise PKIError("the certificate is not signed by the cluster CA") from None
    if _common_name(cert.subject) != node_name:
        raise PKIError(f"the certificate is not for node {node_name!r}")
    if not same_public_key(cert_pem, key_pem):
        raise PKIError("the certificate is not for this node's key")


def same_public_key(cert_pem: bytes | str, key_pem: bytes | str) -> bool:
    """Whether the certificate is for this private key."""
    key = serialization.load_pem_private_key(_bytes(key_pem), password=None)
    der = serialization.Encoding.DER
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    cert_key = _load_cert(cert_pem).public_key()
    return cert_key.public_bytes(der, spki) == key.public_key().public_bytes(der, spki)


# Files


def write_pem(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write atomically; a private file (a key) is 0600 from its first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600 if private else 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_pem(path: Path) -> bytes:
    """A PEM file's bytes; PKIError names the file when it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise PKIError(f"{path}: {e.strerror}") from None


def write_pair(pair: CertKey, cert_path: Path, key_path: Path) -> None:
    """Write a certificate (0644) and its key (0600)."""
    write_pem(key_path, pair.key_pem, private=True)
    write_pem(cert_path, pair.cert_pem)


def read_pair(cert_path: Path, key_path: Path) -> CertKey:
    """Read a certificate and its key."""
    return CertKey(read_pem(cert_path), read_pem(key_path))


# TLS contexts


def server_context(
    ca_pem: bytes | str,
    cert_file: Path,
    key_file: Path,
    *,
    verify_mode: ssl.VerifyMode = ssl.CERT_REQUIRED,
) -> ssl.SSLContext:
    """TLS 1.3 server: presents cert_file; client certs must chain to the CA (when sent)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3  # only our own agents and peers dial this port
    ctx.verify_mode = verify_mode
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    ctx.load_verify_locations(cadata=_bytes(ca_pem).decode())
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


def client_context(
    ca_pem: bytes | str, cert_file: Path | None = None, key_file: Path | None = None
) -> ssl.SSLContext:
    """TLS 1.3 client: trusts only the cluster CA, checks the host name, presents the node cert."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    ctx.load_verify_locations(cadata=_bytes(ca_pem).decode())
    if cert_file is not None:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


# Join tokens


def new_join_token(ca_pem: bytes | str) -> str:
    """'<first 32 hex of the CA fingerprint>.<secret>': the node can pin the CA before sending."""
    return f"{ca_fingerprint(ca_pem)[:TOKEN_HASH_CHARS]}.{secrets.token_urlsafe(32)}"


def split_join_token(token: str) -> tuple[str, str]:
    """(CA hash, secret) of a join token; PKIError (without the token) if malformed."""
    ca_hash, dot, secret = token.strip().partition(".")
    if not dot or not secret or not re.fullmatch(f"[0-9a-f]{{{TOKEN_HASH_CHARS}}}", ca_hash):
        raise PKIError(f"a join token is {TOKEN_HASH_CHARS} hex digits, a '.', then the secret")
    return ca_hash, secret


def token_matches_ca(token: str, ca_pem: bytes | str) -> bool:
    """Whether the token's CA hash is this CA's fingerprint."""
    ca_hash, _ = split_join_token(token)
    return hmac.compare_digest(ca_hash, ca_fingerprint(ca_pem)[:TOKEN_HASH_CHARS])


# Helpers


def _base(
    subject: x509.Name, issuer: x509.Name, public_key: _PublicKey, days: int
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _leaf(
    subject: x509.Name,
    ca_cert: x509.Certificate,
    public_key: _PublicKey,
    days: int,
    *usages: x509.ObjectIdentifier,
) -> x509.CertificateBuilder:
    """An end-entity certificate with the extended key usages given."""
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        _base(subject, ca_cert.subject, public_key, days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _load_ca(ca: CertKey) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = _load_cert(ca.cert_pem)
    key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PKIError("the CA key is not an EC key")
    return cert, key


def _load_cert(pem: bytes | str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(_bytes(pem))
    except ValueError:
        raise PKIError("not a PEM certificate") from None


def _serial(cert: x509.Certificate) -> str:
    return format(cert.serial_number, "x")


def _common_name(name: x509.Name) -> str:
    attrs = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = attrs[0].value if len(attrs) == 1 else ""
    return value if isinstance(value, str) else ""


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))
