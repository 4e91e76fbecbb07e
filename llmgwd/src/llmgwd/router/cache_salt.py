"""vLLM's cache_salt for a request: one per partition (router/isolation.py), so that no
organization (or key) can probe another's prompts through the engine's prefix cache."""

from __future__ import annotations

import base64
import hmac


def of(partition: str, secret: bytes) -> str:
    """The salt of a partition ("org:ID" or "key:ID"): 43 characters (256 bits, base64url, no
    '/' nor '@', as vLLM asks), the same on every control plane holding secret (the cluster
    secret), unpredictable to anyone without it."""
    mac = hmac.new(secret, b"llmgw cache salt:" + partition.encode(), "sha256")
    return base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")
