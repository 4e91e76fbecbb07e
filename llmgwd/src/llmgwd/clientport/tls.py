"""The client port's TLS certificate: read at start, and again at `systemctl reload llmgwd`
(an ACME renewal) into a new context, the old one kept when the new files cannot be used."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

from llmgw import pki
from llmgw.config import ClientPort

log = logging.getLogger("llmgwd.clientport.tls")


def tls_context(settings: ClientPort) -> ssl.SSLContext | None:
    """The client port's TLS context, when a certificate is configured."""
    if not settings.tls_cert:
        return None
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(settings.tls_cert, settings.tls_key or None)
    return tls


def reloaded(settings: ClientPort) -> ssl.SSLContext | None:
    """A new context from settings' certificate and key files, logged with the certificate's
    serial and expiry; None, logged once as a warning naming the file and OpenSSL's reason
    (never a byte of the key), when they cannot be used: the caller keeps the context it has.
    A new context rather than load_cert_chain() into the live one: OpenSSL would keep a new
    certificate whose key did not match, and every later handshake would fail."""
    try:
        tls = tls_context(settings)
        about = _about(Path(settings.tls_cert))
    except (OSError, ValueError, pki.PKIError) as e:  # ssl.SSLError is an OSError
        why = getattr(e, "reason", None) or getattr(e, "strerror", None) or type(e).__name__
        log.warning(
            "client port: the certificate %s or key %s cannot be used (%s): the one loaded "
            "before is kept",
            settings.tls_cert,
            settings.tls_key or "(in the certificate file)",
            why,
        )
        return None
    if tls is not None:
        log.info("client port: certificate %s loaded (%s)", settings.tls_cert, about)
    return tls


def _about(cert: Path) -> str:
    """A certificate file's first certificate: its serial and when it expires."""
    pem = cert.read_bytes()
    serial = pki.serial_of(pem)
    _, until = pki.validity(pem)
    return f"serial {serial}, valid until {until:%Y-%m-%d %H:%M} UTC"
