"""LiteLLM's custom_auth for bench/router: virtual keys with rpm/tpm limits, no database.

LiteLLM keeps virtual keys in Postgres through Prisma, whose engines are downloaded from
binaries.prisma.sh at first use (not reachable here). A custom_auth hook that answers a
UserAPIKeyAuth carrying rpm_limit/tpm_limit gives the same object a database key would,
and LiteLLM's own rate limiter enforces those limits from it (checked at the bench's start).
Loaded by LiteLLM's proxy from its config directory; runs in LiteLLM's venv, not ours.
The keys come from BENCH_LITELLM_KEYS: {"KEY": {"rpm": N, "tpm": N}, ...}.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from fastapi import HTTPException, Request
from litellm.proxy._types import UserAPIKeyAuth

_KEYS: dict[str, dict[str, Any]] = json.loads(os.environ.get("BENCH_LITELLM_KEYS", "{}"))
# Built once, like LiteLLM's own key cache: the hook itself must cost no more than a lookup.
_AUTH = {
    key: UserAPIKeyAuth(
        api_key=key,
        token=hashlib.sha256(key.encode()).hexdigest(),
        key_alias=f"bench-{i}",
        rpm_limit=limits.get("rpm"),
        tpm_limit=limits.get("tpm"),
    )
    for i, (key, limits) in enumerate(_KEYS.items())
}


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    """The key's auth object, or a 401."""
    auth = _AUTH.get(api_key.removeprefix("Bearer ").strip())
    if auth is None:
        raise HTTPException(status_code=401, detail="invalid api key")
    return auth.model_copy()  # LiteLLM writes per-request fields into it
