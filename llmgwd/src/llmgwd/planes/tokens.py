"""One-time tokens for a new control plane (`llmgw plane token`), kept apart from node tokens.

A plane token looks like a node's (the CA's hash, a dot, a secret) so the new host can pin
the CA by it, but it is stored under its own prefix: a node token is never found here and a
plane token never under catalog.TOKENS, so neither is usable as the other.
"""

from __future__ import annotations

import time

import msgspec

from llmgw import pki
from llmgw.api_types import TOKEN_TTL_S
from llmgwd.catalog import JoinToken, hash_secret
from llmgwd.store import Compare, Delete, Get, Store

PREFIX = "/server-tokens/"
TTL_S = TOKEN_TTL_S  # a control plane joins within minutes of its token being made
MAX_TTL_S = 3600

_dec = msgspec.json.Decoder(JoinToken)
_enc = msgspec.json.Encoder()


def _key(token: str) -> str:
    return PREFIX + hash_secret(token)


class PlaneTokens:
    """Plane tokens in the store, by their hash, each with a lease that ends it."""

    def __init__(self, store: Store, ca_pem: bytes) -> None:
        self._store = store
        self._ca_pem = ca_pem

    async def mint(self, ttl_s: float = TTL_S) -> str:
        """A new token, good once for ttl_s seconds."""
        token = pki.new_join_token(self._ca_pem)
        rec = JoinToken(hash=hash_secret(token), expires_at=time.time() + ttl_s)
        lease = await self._store.lease_grant(ttl_s)
        await self._store.put(_key(token), _enc.encode(rec), lease=lease)
        return token

    async def valid(self, token: str) -> bool:
        """Whether the token is live now, without spending it."""
        kv = await self._store.get(_key(token))
        return kv is not None and _dec.decode(kv.value).expires_at > time.time()

    async def consume(self, token: str) -> bool:
        """True once for a live token: deleted in the same transaction that reads it."""
        key = _key(token)
        res = await self._store.txn([Compare(key, "version", ">", 0)], [Get(key), Delete(key)])
        if not res.succeeded or not res.responses or not res.responses[0]:
            return False
        return _dec.decode(res.responses[0][0].value).expires_at > time.time()
