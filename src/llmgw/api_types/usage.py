"""/api/v1's usage: counts and spend summed by a group."""

from __future__ import annotations

import msgspec


# GET /usage, GET /orgs/{org}/usage: usage summed by a group.
class UsageRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Usage summed over one key, model, day, organization, team, project or user (only the
    grouping field is shown; "" for keys of no organization, team, project or user)."""

    key: str | None = None
    name: str | None = None  # the key's name ("" for a key no longer known), grouped by key
    model: str | None = None
    day: str | None = None
    org: str | None = None
    team: str | None = None  # ORG/TEAM
    project: str | None = None  # ORG/PROJECT
    user: str | None = None  # the user's id
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    spend: float


class UsageReport(msgspec.Struct, kw_only=True):
    """GET /usage"""

    by: str
    since: str
    rows: list[UsageRow]
    total: UsageRow
