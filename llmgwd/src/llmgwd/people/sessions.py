"""Sign-in sessions: the key `llmgw login` gets, of one user and with a bounded life, kept by
its hash (the smallest store until users' keys carry an expiry)."""

from __future__ import annotations

import hashlib
import secrets
import time

import msgspec

from llmgwd.people.directory import ROOT
from llmgwd.store import Store

SESSIONS = ROOT + "sessions/"  # + sha256 of the key
PREFIX = "sk-llmgw-session-"  # tells a session's key from a catalog key at a glance


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """A session as stored: whose, and until when; never the key."""

    user: str
    expires_at: float
    created_at: float = 0.0


def _where(secret: str) -> str:
    return SESSIONS + hashlib.sha256(secret.encode()).hexdigest()


async def create(store: Store, user: str, ttl_s: float) -> tuple[str, Session]:
    """A new session of user for ttl_s seconds: its key (shown once) and its record."""
    secret = PREFIX + secrets.token_urlsafe(32)
    now = time.time()
    session = Session(user=user, expires_at=now + ttl_s, created_at=now)
    await store.put(_where(secret), msgspec.json.encode(session))
    return secret, session


async def user_of(store: Store, secret: str) -> str | None:
    """The user whose live session secret is, else None (an expired one is removed)."""
    if not secret.startswith(PREFIX):
        return None
    kv = await store.get(_where(secret))
    if kv is None:
        return None
    session = msgspec.json.decode(kv.value, type=Session)
    if session.expires_at <= time.time():
        await store.delete(_where(secret))
        return None
    return session.user
