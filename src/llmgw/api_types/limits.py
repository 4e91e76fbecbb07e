"""/api/v1's limits: what a key or a level (organization, team, project, user) may use."""

from __future__ import annotations

from typing import Literal

import msgspec

# GET /keys, POST /keys: keys and their limits.
Period = Literal["day", "month"]  # budgets' periods, in UTC


class KeyLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What one key may use; 0 means no limit."""

    rpm: int = 0  # requests per minute
    tpm: int = 0  # tokens (prompt + completion) per minute
    budget_tokens: int = 0  # tokens per budget_tokens_per
    budget_tokens_per: Period = "day"
    budget_spend: float = 0.0  # money per budget_spend_per, in the prices' currency
    budget_spend_per: Period = "day"


class LevelView(msgspec.Struct, kw_only=True):
    """GET, PATCH /orgs/{org}/limits..., /users/{user}/limits: one level's limits and the
    models it may use ([]: every model)."""

    level: str  # org:ORG, team:ORG:TEAM, project:ORG:PROJECT, user:ID
    limits: KeyLimits
    models: list[str]
