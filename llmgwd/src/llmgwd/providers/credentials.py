"""A provider's credential sealed at rest: AES-256-GCM under a key HKDF derives from the cluster
secret, bound to its model's name (a sealed value copied to another model does not open)."""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

VERSION = "v1:"
_INFO = b"llmgw provider credential v1"
_NONCE = 12


class CredentialError(Exception):
    """A sealed credential that does not open here (another cluster's secret, or changed)."""


class Credentials:
    """Seals and opens providers' credentials with a key of the cluster secret."""

    def __init__(self, secret: bytes) -> None:
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(secret)
        self._aead = AESGCM(key)

    def seal(self, model: str, credential: str) -> str:
        """The credential as stored: VERSION and base64url of nonce and ciphertext."""
        nonce = os.urandom(_NONCE)
        sealed = self._aead.encrypt(nonce, credential.encode(), model.encode())
        return VERSION + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, model: str, sealed: str) -> str:
        """What seal() sealed for model; CredentialError otherwise (never says the value)."""
        if not sealed.startswith(VERSION):
            raise CredentialError(f"the credential of {model!r} is not sealed by this llmgw")
        try:
            raw = base64.urlsafe_b64decode(sealed[len(VERSION) :])
            plain = self._aead.decrypt(raw[:_NONCE], raw[_NONCE:], model.encode())
        except (ValueError, InvalidTag):
            raise CredentialError(
                f"the credential of {model!r} does not open with this cluster's secret"
            ) from None
        return plain.decode()
