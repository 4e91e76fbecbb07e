"""vLLM's cache_salt for a request: one per account, so that no account can probe another's
prompts through the engine's prefix cache."""

from __future__ import annotations

import base64
import hmac

from llmgwd.catalog import ApiKey


def of(key: ApiKey) -> str:
    """The salt of key's account: 43 characters (256 bits, base64url, no '/' nor '@', as vLLM
    asks), unpredictable to anyone without the key's stored hash. Keys have no accounts yet:
    each key is its own account, and its requests share a cache with no other key's."""
    account = key.id
    mac = hmac.new(bytes.fromhex(key.hash), b"llmgw cache salt:" + account.encode(), "sha256")
    return base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")


