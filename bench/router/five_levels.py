"""bench/router/five_levels.py: a key's five levels of limits (key, user, org, team, project)."""

from __future__ import annotations

import msgspec

from llmgwd.accounting.levels import (
    LEVELS,
    LevelLimits,
    Levels,
    org_level,
    project_level,
    team_level,
    user_level,
)
from llmgwd.catalog import ApiKey, KeyLimits
from llmgwd.people.directory import PROJECTS
from llmgwd.people.records import Project

HUGE = 10**12
# rpm, tpm, a token budget and a spend budget, each far above what a bench ever asks
BIG = KeyLimits(rpm=HUGE, tpm=HUGE, budget_tokens=HUGE, budget_spend=10**6,
                budget_spend_per="month")  # fmt: skip
USER, ORG, TEAM, PROJECT = "u", "acme", "ml", "chat"


def levels_of_five() -> Levels:
    """The levels above a key of USER in PROJECT of TEAM of ORG, each with BIG limits (the
    key's own limits are the fifth)."""
    levels = Levels()
    project = Project(org=ORG, name=PROJECT, team=TEAM)
    levels.apply(f"{PROJECTS}{ORG}/{PROJECT}", msgspec.json.encode(project))
    for level in (user_level(USER), org_level(ORG), team_level(ORG, TEAM),
                  project_level(ORG, PROJECT)):  # fmt: skip
        levels.apply(LEVELS + level, msgspec.json.encode(LevelLimits(limits=BIG)))
    return levels


def owned(key: ApiKey) -> ApiKey:
    """key as USER's key in PROJECT of ORG (so that levels_of_five's levels hold it)."""
    return msgspec.structs.replace(key, user=USER, org=ORG, project=PROJECT)
