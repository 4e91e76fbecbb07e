"""/api/v1's people: organizations, teams, projects, memberships, users, staff roles
and people's keys."""

from __future__ import annotations

from typing import Literal

import msgspec

from llmgw.api_types.limits import KeyLimits

# People (llmgwd/api/people.py, person_keys.py): organizations, teams, projects, memberships,
# users, staff roles and people's keys, as /api/v1 answers them.

PersonRole = Literal["admin", "manager", "member"]
StaffRoleName = Literal["admin", "operator", "viewer"]


class OrgView(msgspec.Struct, kw_only=True):
    """An organization: GET /orgs, GET /orgs/{org}, POST /orgs."""

    name: str
    title: str = ""  # shown to people; the name is the handle
    created_at: float = 0.0


class TeamView(msgspec.Struct, kw_only=True):
    """A team of an organization: GET and POST /orgs/{org}/teams."""

    org: str
    name: str
    title: str = ""
    created_at: float = 0.0


class ProjectView(msgspec.Struct, kw_only=True):
    """A project of an organization, in one of its teams or not (team ""): GET and POST
    /orgs/{org}/projects."""

    org: str
    name: str
    team: str = ""
    title: str = ""
    created_at: float = 0.0


class ScopeView(msgspec.Struct, kw_only=True):
    """Where a membership holds: the organization (kind org, name ""), or a team or project."""

    org: str
    kind: Literal["org", "team", "project"] = "org"
    name: str = ""


class MembershipView(msgspec.Struct, kw_only=True):
    """A user's role in a scope: GET /orgs/{org}/members, PUT .../members/{user}."""

    user: str  # the user's id
    scope: ScopeView
    role: PersonRole
    set_by: Literal["hand", "group"] = "hand"  # a group's rule never rewrites a hand's
    group: str = ""  # the group whose rule set it
    sources: dict[Literal["oidc", "scim"], PersonRole] = {}  # each group source's role
    updated_at: float = 0.0


class UserView(msgspec.Struct, kw_only=True):
    """A user: GET /users, /users/{user}, POST /users, PATCH /users/{user}."""

    id: str  # 12 hex digits, never reused
    name: str
    email: str = ""
    source: Literal["oidc", "scim", "staff"] = "staff"
    active: bool = True
    created_at: float = 0.0
    external_id: str = ""  # who they are at the identity provider; "": none


class StaffView(msgspec.Struct, kw_only=True):
    """PUT /users/{user}/staff: the user's staff role now (null: none)."""

    user: str
    staff: StaffRoleName | None


class Deleted(msgspec.Struct, kw_only=True):
    """DELETE /orgs/{org}, .../teams/{team}, .../projects/{project}: the name gone."""

    name: str
    deleted: bool


class UserDeleted(msgspec.Struct, kw_only=True):
    """DELETE /users/{user}: the user's id, gone (their keys revoked)."""

    user: str
    deleted: bool


class MemberRemoved(msgspec.Struct, kw_only=True):
    """DELETE .../members/{user}: the user's id, their membership there gone."""

    user: str
    removed: bool


class PersonKeyView(msgspec.Struct, kw_only=True):
    """A person's key without its secret or hash; key is set only in the answer that made it
    (/me/keys, /orgs/{org}/projects/{project}/keys and service-keys)."""

    id: str
    name: str
    prefix: str
    user: str  # its maker's id
    org: str
    project: str  # "": a staff key
    service: bool
    created_at: float
    revoked: bool
    limits: KeyLimits
    key: str = ""
