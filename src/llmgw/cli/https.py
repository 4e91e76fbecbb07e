"""The CLI's HTTPS transport to a control plane's client port: TLS trusting the context's
pinned CA only (or the system's CAs when none is pinned), the key as a bearer token, through
HTTPS_PROXY (a CONNECT tunnel) unless NO_PROXY names the host, as llmgw.proxy selects."""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec
from yarl import URL

from llmgw import ipc, pki, proxy

_ENCODING_DER = 2  # _ssl.ENCODING_DER, for the private chain's certificates
_NAME_MISMATCH = (62, 64)  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH


class PinMismatch(Exception):
    """The server's CA is not the pinned one; the message names both fingerprints."""


@dataclass(frozen=True, slots=True)
class Remote:
    """Where and as whom a context's commands go: never printed (it holds the key)."""

    url: str  # https://HOST:PORT
    ca_pem: bytes | None = None  # the pinned CA; None: the system's trusted CAs
    key: str | None = None

    def __repr__(self) -> str:
        return f"Remote(url={self.url!r})"


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or 443


def proxy_for(url: str) -> str:
    """The proxy a connection to url goes through ("": straight): HTTPS_PROXY/HTTP_PROXY and
    NO_PROXY of the environment, read as the daemons read them (llmgw.proxy.resolve); one
    that is no http://HOST:PORT is an IpcError naming it without its credentials."""
    try:
        return proxy.resolve("", (), os.environ).proxy_for(url)
    except ValueError as e:
        raise ipc.IpcError(f"HTTPS_PROXY/HTTP_PROXY: {e}") from None


def through(url: str) -> str:
    """ " (through proxy http://****@host:3128)" for an error about url, or ""."""
    via = proxy_for(url)
    return f" (through proxy {proxy.redact(via)})" if via else ""


def _tunnelled(conn: http.client.HTTPConnection, url: str, via: str) -> None:
    """Make conn, made to the proxy via, CONNECT to url's host and port (the proxy's user
    and password, if any, as Proxy-Authorization to the proxy alone); an IPv6 address in
    brackets, as CONNECT's authority-form needs (http.client of 3.11 sends it bare)."""
    host, port = _address(url)
    host = f"[{host}]" if ":" in host else host
    u, headers = URL(via), {}
    if u.user:
        pair = f"{u.user}:{u.password or ''}".encode()
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(pair).decode()
    conn.set_tunnel(host, port, headers)


def _socket(url: str, timeout: float) -> socket.socket:
    """A TCP connection to url's host and port, or a tunnel to them through the proxy."""
    via = proxy_for(url)
    if not via:
        return socket.create_connection(_address(url), timeout=timeout)
    u = URL(via)
    conn = http.client.HTTPConnection(u.host or "", u.port, timeout=timeout)
    _tunnelled(conn, url, via)
    conn.connect()  # the CONNECT, answered 200 (else OSError "Tunnel connection failed")
    sock, conn.sock = conn.sock, None
    return sock


def tls_context(ca_pem: bytes | None) -> ssl.SSLContext:
    """A verifying client context: only ca_pem as trust anchor, or the system's CAs."""
    if ca_pem is None:
        return ssl.create_default_context()
    return ssl.create_default_context(cadata=ca_pem.decode())


def offered_chain(url: str, timeout: float = ipc.DEFAULT_TIMEOUT_S) -> list[bytes]:
    """The certificates (DER) the server at url sends in its handshake, unverified: only to
    be matched against a fingerprint the person gave, never trusted as they come."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    host = _address(url)[0]
    try:
        with (
            _socket(url, timeout) as raw,
            ctx.wrap_socket(raw, server_hostname=host) as tls,
        ):
            return _chain(tls)
    except (OSError, ssl.SSLError) as e:
        raise ipc.IpcError(f"cannot reach {url}{through(url)}: {e.strerror or e}") from None


def _chain(tls: ssl.SSLSocket) -> list[bytes]:
    public = getattr(tls, "get_unverified_chain", None)  # Python 3.13
    if public is not None:
        return list(public())
    # Python 3.10-3.12 have it on the private object only.
    sslobj: Any = tls._sslobj  # type: ignore[attr-defined]  # private before Python 3.13
    certs: list[Any] = sslobj.get_unverified_chain() or []
    return [c.public_bytes(_ENCODING_DER) for c in certs]


def fingerprint(der: bytes) -> str:
    """sha256 of a certificate's DER, lowercase hex (what pki.ca_fingerprint gives)."""
    return hashlib.sha256(der).hexdigest()


def pinned_ca(url: str, pin: str) -> bytes:
    """The CA certificate (PEM) in the server's chain whose fingerprint is pin, or PinMismatch
    naming what the server offers."""
    chain = offered_chain(url)
    for der in chain:
        if fingerprint(der) == pin:
            pem = ssl.DER_cert_to_PEM_cert(der).encode()
            try:
                pki.check_ca(pem)
            except pki.PKIError as e:
                raise PinMismatch(f"the certificate sha256 {pin} at {url}: {e}") from None
            return pem
    offered = fingerprint(chain[-1]) if chain else "none"
    raise PinMismatch(
        f"the server at {url} offers sha256 {offered} (its chain's last certificate), not "
        f"the pinned CA sha256 {pin} (a server that does not send its CA: give it with --ca-file)"
    )


def system_trusts(url: str, timeout: float = ipc.DEFAULT_TIMEOUT_S) -> bool:
    """Whether the server at url has a certificate for its name from a CA this system trusts."""
    host = _address(url)[0]
    try:
        with (
            _socket(url, timeout) as raw,
            ssl.create_default_context().wrap_socket(raw, server_hostname=host),
        ):
            return True
    except ssl.SSLCertVerificationError:
        return False
    except (OSError, ssl.SSLError) as e:
        raise ipc.IpcError(f"cannot reach {url}{through(url)}: {e.strerror or e}") from None


def offered_ca(url: str) -> bytes | None:
    """The CA certificate (PEM) that ends the server's chain, unverified (for the person to
    check its fingerprint), or None when the chain ends with no CA."""
    chain = offered_chain(url)
    if not chain:
        return None
    pem = ssl.DER_cert_to_PEM_cert(chain[-1]).encode()
    try:
        pki.check_ca(pem)
    except pki.PKIError:
        return None
    return pem


def _mismatch(remote: Remote) -> PinMismatch:
    if remote.ca_pem:
        trusted = f"the pinned CA sha256 {pki.ca_fingerprint(remote.ca_pem)}"
    else:
        trusted = "a CA this system trusts (pin one: llmgw context add --ca-fingerprint)"
    try:
        chain = offered_chain(remote.url)
        offered = fingerprint(chain[-1]) if chain else "none"
    except ipc.IpcError:
        offered = "unknown"
    return PinMismatch(
        f"the server at {remote.url} is not signed by {trusted}; "
        f"it offers sha256 {offered} (its chain's last certificate)"
    )


def connection(remote: Remote, timeout: float) -> http.client.HTTPSConnection:
    """A connection to remote that trusts its pinned CA only (or the system's CAs), made
    through the proxy (a CONNECT tunnel, the TLS end to end) unless NO_PROXY names it."""
    via, context = proxy_for(remote.url), tls_context(remote.ca_pem)
    if not via:
        host, port = _address(remote.url)
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    u = URL(via)
    conn = http.client.HTTPSConnection(u.host or "", u.port, timeout=timeout, context=context)
    _tunnelled(conn, remote.url, via)
    return conn


def auth_headers(remote: Remote) -> dict[str, str]:
    """The Authorization header of remote's key, if it has one."""
    return {"Authorization": f"Bearer {remote.key}"} if remote.key else {}


def request(
    remote: Remote, method: str, path: str, body: object = None, *,
    timeout: float = ipc.DEFAULT_TIMEOUT_S,
) -> tuple[int, Any]:  # fmt: skip
    """One request to remote; the HTTP status and the decoded JSON answer (None if empty).
    IpcError when it cannot be reached, PinMismatch when its certificate is not the CA's."""
    conn, host = connection(remote, timeout), _address(remote.url)[0]
    headers = {"Accept": "application/json", **auth_headers(remote)}
    payload = None if body is None else msgspec.json.encode(body)
    if payload is not None:
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        status, raw = resp.status, resp.read()
    except ssl.SSLCertVerificationError as e:
        if e.verify_code in _NAME_MISMATCH:  # the CA's certificate, for another name
            named = f"the server at {remote.url} has a certificate not for {host}"
            raise PinMismatch(f"{named} ({e.verify_message})") from None
        raise _mismatch(remote) from None
    except (OSError, http.client.HTTPException) as e:
        why = getattr(e, "strerror", None) or e or type(e).__name__
        raise ipc.IpcError(
            f"cannot reach llmgwd at {remote.url}{through(remote.url)}: {why}"
        ) from None
    finally:
        conn.close()
    try:
        return status, msgspec.json.decode(raw) if raw else None
    except msgspec.DecodeError:
        raise ipc.IpcError(f"{remote.url} answered {status} with a body not JSON") from None
