"""/api/v1's keys: a key as listed, and one just made."""

from __future__ import annotations

import msgspec

from llmgw.api_types.limits import KeyLimits


class KeyView(msgspec.Struct, kw_only=True):
    """A key without its secret or hash."""

    id: str
    name: str
    prefix: str
    role: str
    created_at: float
    revoked: bool
    limits: KeyLimits


class NewKey(msgspec.Struct, kw_only=True):
    """A key just made: the only answer that holds the key itself."""

    id: str
    name: str
    role: str
    prefix: str
    created_at: float
    limits: KeyLimits
    key: str
