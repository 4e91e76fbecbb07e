"""/api/v1's keys: a key to make, a key as listed, and one just made."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from llmgw.api_types.limits import KeyLimits, LimitsIn

# 1-64 printable characters, not 12 hex digits (a key's id): what llmgwd's keys._check_key_in
# checks.
_PRINTABLE, _EDGE = r"[^\x00-\x1f\x7f-\x9f]", r"[^\s\x00-\x1f\x7f-\x9f]"
KEY_NAME = rf"^(?![0-9a-fA-F]{{12}}$){_EDGE}(?:{_PRINTABLE}{{0,62}}{_EDGE})?$"
KEY_NAME_RULE = "must be 1-64 printable characters and not look like a key's id (12 hex digits)"


class KeyIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /api/v1/keys"""

    name: Annotated[str, msgspec.Meta(pattern=KEY_NAME, description=KEY_NAME_RULE)]
    role: Literal["user", "admin"] = "user"
    limits: LimitsIn | None = None


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
