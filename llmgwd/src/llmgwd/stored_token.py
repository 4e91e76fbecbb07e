"""A bearer token kept in the store only as its sha256, one at a time (SCIM's, the metrics
scrape's): a new one replaces the old, and none is valid until one is made."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from aiohttp import web

from llmgwd.store import Store


def hash_of(secret: str) -> str:
    """The stored form of a token (random, so a plain sha256 is enough)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def bearer(request: web.Request) -> str:
    """The secret of the request's `Authorization: Bearer SECRET`, "" when none."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    return secret.strip() if scheme.lower() == "bearer" else ""


@dataclass(frozen=True, slots=True)
class StoredToken:
    """One kind of token: where its hash is kept, and the prefix its secrets start with."""

    key: str  # the store key holding the sha256 hex
    prefix: str  # tells a reader what the secret is for (and that it is no API key)

    async def mint(self, store: Store) -> str:
        """A new token, replacing any old one; returned this once, never stored."""
        secret = self.prefix + secrets.token_urlsafe(32)
        await store.put(self.key, hash_of(secret).encode())
        return secret

    async def stored_hash(self, store: Store) -> str:
        """The token's hash, "" when none was made."""
        kv = await store.get(self.key)
        return kv.value.decode() if kv is not None else ""

    async def matches(self, store: Store, secret: str) -> bool:
        """Whether secret is the current token (compared in constant time)."""
        if not secret:
            return False
        kept = await self.stored_hash(store)
        return bool(kept) and hmac.compare_digest(kept, hash_of(secret))
