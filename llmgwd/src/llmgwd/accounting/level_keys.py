"""Where a level's limits and models are kept (/limits/LEVEL) and how a level is named; no
imports of the rest, so the people directory removes a level's record with its owner."""

from __future__ import annotations

LEVELS = "/limits/"  # + a level's id: org:ORG, team:ORG:TEAM, project:ORG:PROJECT, user:ID


def org_level(org: str) -> str:
    """The level id of an organization."""
    return f"org:{org}"


def team_level(org: str, team: str) -> str:
    """The level id of a team of org."""
    return f"team:{org}:{team}"


def project_level(org: str, project: str) -> str:
    """The level id of a project of org."""
    return f"project:{org}:{project}"


def user_level(user: str) -> str:
    """The level id of a user (by id)."""
    return f"user:{user}"


def in_org(org: str) -> tuple[str, ...]:
    """The store prefixes of every team's and project's level of org (names hold no ':', so
    no other organization's starts with these)."""
    return (LEVELS + f"team:{org}:", LEVELS + f"project:{org}:")
