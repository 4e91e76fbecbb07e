"""/api/v1's people: organizations, teams, projects, memberships, users, staff roles
and people's keys, as they are asked for and as they are answered."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from llmgw.api_types.common import NAME_PATTERN, NAME_RULE, Email, ExternalId, Name, Title
from llmgw.api_types.keys import KEY_NAME, KEY_NAME_RULE
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
    sources: dict[Literal["oidc", "scim", "ldap"], PersonRole] = {}  # each group source's role
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
    approved: bool = True  # False: waiting for staff's approval (oidc.approval_required)


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


# What they take (llmgwd/api/people.py, person_keys.py check them again).
OPTIONAL_NAME = f"^(|{NAME_PATTERN[1:-1]})$"  # "" or a name


class NamedIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /orgs, POST /orgs/{org}/teams"""

    name: Name
    title: Title = ""


class ProjectIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /orgs/{org}/projects"""

    name: Name
    team: Annotated[str, msgspec.Meta(pattern=OPTIONAL_NAME, description=NAME_RULE)] = ""
    title: Title = ""


class UserIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /users: a user made by staff."""

    name: Name
    email: Email = ""
    external_id: ExternalId = ""  # their first OIDC sign-in with it is theirs


class UserChange(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """PATCH /users/{user}: the fields given change."""

    email: Email | None = None
    active: bool | None = None
    external_id: ExternalId | None = None


class RoleIn(msgspec.Struct, forbid_unknown_fields=True):
    """PUT .../members/{user}"""

    role: PersonRole


class StaffIn(msgspec.Struct, forbid_unknown_fields=True):
    """PUT /users/{user}/staff: null takes the staff role away."""

    role: StaffRoleName | None


class PersonKeyIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /me/keys, POST /orgs/{org}/projects/{project}/keys and .../service-keys"""

    # What _make checks, as POST /keys's KeyIn says it (a key's name, not a people Name)
    name: Annotated[str, msgspec.Meta(pattern=KEY_NAME, description=KEY_NAME_RULE)]
