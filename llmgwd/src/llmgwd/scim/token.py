"""The identity provider's SCIM bearer token: one at a time, made by `llmgw scim token`, kept
only as its hash (a new one replaces the old)."""

from __future__ import annotations

import hashlib
import secrets

from llmgwd.people.directory import ROOT
from llmgwd.store import Store

TOKEN = ROOT + "scim/token"  # sha256 hex of the token
PREFIX = "scim-llmgw-"


def hash_of(secret: str) -> str:
    """The stored form of a token (random, so a plain sha256 is enough)."""
    return hashlib.sha256(secret.encode()).hexdigest()


async def mint(store: Store) -> str:
    """A new token, replacing any old one; returned this once, never stored."""
    secret = PREFIX + secrets.token_urlsafe(32)
    await store.put(TOKEN, hash_of(secret).encode())
    return secret


async def stored_hash(store: Store) -> str:
    """The token's hash, "" when none was made."""
    kv = await store.get(TOKEN)
    return kv.value.decode() if kv is not None else ""
