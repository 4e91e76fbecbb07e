"""The console's form token (CSRF): an HMAC of the session's cookie value, carried by every form
of a signed-in page and checked before any form is acted on."""

from __future__ import annotations

import hashlib
import hmac

FIELD = "csrf"  # the form field that carries it


def token(key: bytes, session: str) -> str:
    """The form token of a session (key: session.derived(secret, "csrf"))."""
    return hmac.new(key, b"csrf:" + session.encode(), hashlib.sha256).hexdigest()


def valid(key: bytes, session: str, sent: str) -> bool:
    """Whether sent is the session's form token (compared as bytes: a str of other than
    ASCII would make compare_digest raise)."""
    mine = token(key, session).encode()
    return bool(session) and hmac.compare_digest(mine, sent.encode(errors="replace"))
