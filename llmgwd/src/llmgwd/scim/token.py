"""The identity provider's SCIM bearer token: one at a time, made by `llmgw scim token`, kept
only as its hash (a new one replaces the old)."""

from __future__ import annotations

from llmgwd.people.directory import ROOT
from llmgwd.stored_token import StoredToken, hash_of

__all__ = ["PREFIX", "SCIM", "TOKEN", "hash_of", "mint", "stored_hash"]

TOKEN = ROOT + "scim/token"  # sha256 hex of the token
PREFIX = "scim-llmgw-"
SCIM = StoredToken(TOKEN, PREFIX)
mint = SCIM.mint
stored_hash = SCIM.stored_hash
