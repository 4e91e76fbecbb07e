"""The console's session cookie: an HMAC-signed envelope of a key's id, how the session began, a
random session id and an expiry (never the key); the one-shot flash cookie that carries a
change's outcome to the next page; and an OIDC sign-in's pending state, nonce and PKCE verifier,
signed alike."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from aiohttp import web

COOKIE = "llmgw_console"
FLASH = "llmgw_console_flash"
PATH = "/console"
MAX_AGE_S = 8 * 3600  # a session's longest life; the key's own end and revocation come first
PENDING = "llmgw_console_oidc"  # an OIDC sign-in under way
PENDING_PATH = PATH + "/login/oidc"  # sent to the start and the callback only
PENDING_AGE_S = 600  # the person has this long at the provider
_B64URL = "[A-Za-z0-9_-]"
_PENDING = re.compile(
    rf"p1\.(?P<state>{_B64URL}{{16,64}})\.(?P<nonce>{_B64URL}{{16,64}})"
    rf"\.(?P<verifier>{_B64URL}{{43,128}})\.(?P<exp>[0-9]{{1,12}})\.(?P<sig>[0-9a-f]{{64}})"
)
_VALUE = re.compile(
    r"v2\.(?P<kind>[ko])\.(?P<id>[0-9a-f]{1,64})\.(?P<sid>[0-9a-f]{32})"
    r"\.(?P<exp>[0-9]{1,12})\.(?P<sig>[0-9a-f]{64})"
)
BY_KEY, BY_OIDC = "k", "o"  # a pasted key's session; an OIDC sign-in's (its key is the session's)


def derived(secret: bytes, purpose: str) -> bytes:
    """A key for one use, from the secret every control plane shares (so any of them opens a
    session another made)."""
    return hmac.new(secret, b"llmgw console " + purpose.encode(), hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class Pending:
    """An OIDC sign-in under way: what the provider's redirect back must match (state), what
    the ID token must carry (nonce), and the PKCE verifier its code is redeemed with."""

    state: str
    nonce: str
    verifier: str


@dataclass(frozen=True, slots=True)
class Session:
    """An opened session cookie: its key's id, how it began (BY_KEY, BY_OIDC), its id and end."""

    key_id: str
    kind: str
    sid: str  # random: what sign-out records as ended (console.ended)
    expires: int


@dataclass(frozen=True, slots=True)
class Sessions:
    """Makes, opens and clears the session cookie."""

    key: bytes  # derived(secret, "session")
    secure: bool  # the client port has TLS: the cookie is sent over it only
    max_age_s: int = MAX_AGE_S

    def _sign(self, text: str) -> str:
        return hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()

    def value(
        self, key_id: str, now: float | None = None, kind: str = BY_KEY, sid: str | None = None
    ) -> str:
        """A signed cookie value naming key_id (a session of kind, its id sid, else a new
        random one), ending max_age_s from now."""
        expires = int((time.time() if now is None else now) + self.max_age_s)
        body = f"v2.{kind}.{key_id}.{sid or secrets.token_hex(16)}.{expires}"
        return f"{body}.{self._sign(body)}"

    def opened(self, value: str, now: float | None = None) -> Session | None:
        """The session a cookie value holds, if its signature holds and it has not expired."""
        m = _VALUE.fullmatch(value)
        if m is None:
            return None
        body = value[: m.start("sig") - 1]
        if not hmac.compare_digest(m["sig"].encode(), self._sign(body).encode()):
            return None
        if int(m["exp"]) <= (time.time() if now is None else now):
            return None
        return Session(m["id"], m["kind"], m["sid"], int(m["exp"]))

    def key_id(self, value: str, now: float | None = None) -> str | None:
        """The key id a cookie value names, if its signature holds and it has not expired."""
        session = self.opened(value, now)
        return session.key_id if session else None

    def set(self, response: web.StreamResponse, key_id: str, kind: str = BY_KEY) -> None:
        """Start a session of kind for key_id on response."""
        response.set_cookie(
            COOKIE,
            self.value(key_id, kind=kind),
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
        mine = self._sign("flash:" + body).encode()
        if not body or not hmac.compare_digest(sig.encode(errors="replace"), mine):
            return ""
        try:
            return base64.urlsafe_b64decode(body).decode(errors="replace")
        except ValueError:
            return ""

    def unflash(self, response: web.StreamResponse) -> None:
        """Drop the flash cookie (its text was shown)."""
        response.del_cookie(FLASH, path=PATH, secure=self.secure, httponly=True, samesite="Strict")

    def pend(self, response: web.StreamResponse, p: Pending, now: float | None = None) -> None:
        """Keep an OIDC sign-in's pending values for PENDING_AGE_S, signed. SameSite=Lax, not
        Strict: the provider's redirect back is a navigation from its site, on which a browser
        sends a Strict cookie not at all (Lax: on a top-level GET, as that redirect is)."""
        expires = int((time.time() if now is None else now) + PENDING_AGE_S)
        body = f"p1.{p.state}.{p.nonce}.{p.verifier}.{expires}"
        response.set_cookie(
            PENDING,
            f"{body}.{self._sign('pending:' + body)}",
            max_age=PENDING_AGE_S,
            path=PENDING_PATH,
            secure=self.secure,
            httponly=True,
            samesite="Lax",
        )

    def pending(self, value: str, now: float | None = None) -> Pending | None:
        """The pending sign-in a cookie value holds, if signed by us and not expired."""
        m = _PENDING.fullmatch(value)
        if m is None:
            return None
        body = value[: m.start("sig") - 1]
        if not hmac.compare_digest(m["sig"], self._sign("pending:" + body)):
            return None
        if int(m["exp"]) <= (time.time() if now is None else now):
            return None
        return Pending(m["state"], m["nonce"], m["verifier"])

    def unpend(self, response: web.StreamResponse) -> None:
        """Drop the pending sign-in (used, or refused: a code is redeemed once)."""
        response.del_cookie(
            PENDING, path=PENDING_PATH, secure=self.secure, httponly=True, samesite="Lax"
        )
