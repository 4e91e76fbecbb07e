"""/api/v1's limits: what a key or a level (organization, team, project, user) may use, and
the changes of them it takes."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

MAX_MONEY = 1e9  # a price per million tokens, or a budget
Money = Annotated[  # what llmgwd.accounting.views._check_money checks
    float,
    msgspec.Meta(ge=0, le=MAX_MONEY, description=f"must be a number between 0 and {MAX_MONEY:.0f}"),
]

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


class LimitsIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A key's limits to change (in POST /keys, and PATCH /keys/{key}/limits); 0 removes one."""

    rpm: int | None = None
    tpm: int | None = None
    budget_tokens: int | None = None
    budget_tokens_per: Period | None = None
    budget_spend: float | None = None
    budget_spend_per: Period | None = None


class LevelIn(LimitsIn, forbid_unknown_fields=True, kw_only=True):
    """PATCH .../limits: the limits given change (0 removes one); models, when given, replaces
    the list of models it may use ([]: every model)."""

    models: list[str] | None = None
