"""The console's session cookie: an HMAC-signed envelope of a key's id and an expiry (never the
key); and the one-shot flash cookie that carries a change's outcome to the next page."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from dataclasses import dataclass

from aiohttp import web

COOKIE = "llmgw_console"
FLASH = "llmgw_console_flash"
PATH = "/console"
MAX_AGE_S = 8 * 3600  # a session's longest life; the key's own end and revocation come first
_VALUE = re.compile(r"v1\.(?P<id>[0-9a-f]{1,64})\.(?P<exp>[0-9]{1,12})\.(?P<sig>[0-9a-f]{64})")


def derived(secret: bytes, purpose: str) -> bytes:
    """A key for one use, from the secret every control plane shares (so any of them opens a
    session another made)."""
    return hmac.new(secret, b"llmgw console " + purpose.encode(), hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class Sessions:
    """Makes, opens and clears the session cookie."""

    key: bytes  # derived(secret, "session")
    secure: bool  # the client port has TLS: the cookie is sent over it only
    max_age_s: int = MAX_AGE_S

    def _sign(self, text: str) -> str:
        return hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()

    def value(self, key_id: str, now: float | None = None) -> str:
        """A signed cookie value naming key_id, ending max_age_s from now."""
        expires = int((time.time() if now is None else now) + self.max_age_s)
        body = f"v1.{key_id}.{expires}"
        return f"{body}.{self._sign(body)}"

    def key_id(self, value: str, now: float | None = None) -> str | None:
        """The key id a cookie value names, if its signature holds and it has not expired."""
        m = _VALUE.fullmatch(value)
        if m is None:
            return None
        body = value[: m.start("sig") - 1]
        if not hmac.compare_digest(m["sig"], self._sign(body)):
            return None
        if int(m["exp"]) <= (time.time() if now is None else now):
            return None
        return m["id"]

    def set(self, response: web.StreamResponse, key_id: str) -> None:
        """Start a session for key_id on response."""
        response.set_cookie(
            COOKIE,
            self.value(key_id),
            max_age=self.max_age_s,
            path=PATH,
            secure=self.secure,
            httponly=True,
            samesite="Strict",
        )

    def clear(self, response: web.StreamResponse) -> None:
        """End the session on response (the cookie emptied and expired)."""
        response.del_cookie(COOKIE, path=PATH, secure=self.secure, httponly=True, samesite="Strict")

    def flash(self, response: web.StreamResponse, text: str) -> None:
        """Say text on the next page (a signed cookie of a minute's life)."""
        body = base64.urlsafe_b64encode(text.encode()[:512]).decode()
        value = f"{body}.{self._sign('flash:' + body)}"
        response.set_cookie(
            FLASH,
            value,
            max_age=60,
            path=PATH,
            secure=self.secure,
            httponly=True,
            samesite="Strict",
        )

    def flashed(self, value: str) -> str:
        """The text a flash cookie carries, if signed by us; else ""."""
        body, _, sig = value.partition(".")
        if not body or not hmac.compare_digest(sig, self._sign("flash:" + body)):
            return ""
        try:
            return base64.urlsafe_b64decode(body).decode(errors="replace")
        except ValueError:
            return ""

    def unflash(self, response: web.StreamResponse) -> None:
        """Drop the flash cookie (its text was shown)."""
        response.del_cookie(FLASH, path=PATH, secure=self.secure, httponly=True, samesite="Strict")
