"""The people records as stored: users, organizations, teams, projects, memberships, staff."""

from __future__ import annotations

from typing import Literal

import msgspec

Source = Literal["oidc", "scim", "staff"]  # how a user came: signed in, provisioned, made
MemberRole = Literal["admin", "manager", "member"]
StaffRole = Literal["admin", "operator", "viewer"]
ScopeKind = Literal["org", "team", "project"]
SetBy = Literal["hand", "group"]  # a role set by a person, or by a group rule (OIDC, SCIM, LDAP)
GroupSource = Literal["oidc", "scim", "ldap"]  # where a group rule's groups came from

MEMBER_ROLES: tuple[MemberRole, ...] = ("member", "manager", "admin")  # weakest first
STAFF_ROLES: tuple[StaffRole, ...] = ("viewer", "operator", "admin")
SCOPE_KINDS: tuple[ScopeKind, ...] = ("org", "team", "project")


class User(msgspec.Struct, frozen=True, kw_only=True):
    """A person: signed in through OIDC, provisioned by SCIM, or made by staff."""

    id: str  # 12 hex digits, never reused
    name: str  # a login name, unique
    email: str = ""
    source: Source = "staff"
    active: bool = True  # False: deactivated (SCIM, staff); their keys stop
    created_at: float = 0.0
    # who they are at the identity provider (SCIM's externalId, or set by staff): the first
    # OIDC sign-in whose oidc.link_claim equals it is theirs (people.links); "": none
    external_id: str = ""
    # False: signed in while oidc.approval_required was on, and waits for staff's approval
    # (`llmgw user approve`): no sign-in, no key until then
    approved: bool = True


class Org(msgspec.Struct, frozen=True, kw_only=True):
    """An organization: a department or a company, with its teams and projects."""

    name: str
    title: str = ""  # shown to people; the name is the handle
    created_at: float = 0.0


class Team(msgspec.Struct, frozen=True, kw_only=True):
    """A team in an organization."""

    org: str
    name: str
    title: str = ""
    created_at: float = 0.0


class Project(msgspec.Struct, frozen=True, kw_only=True):
    """A project in an organization, optionally in one of its teams."""

    org: str
    name: str
    team: str = ""  # "": the organization's own
    title: str = ""
    created_at: float = 0.0


class Scope(msgspec.Struct, frozen=True, kw_only=True):
    """Where a membership holds: an organization, or one of its teams or projects."""

    org: str
    kind: ScopeKind = "org"
    name: str = ""  # the team's or project's; "" for the organization itself


class Membership(msgspec.Struct, frozen=True, kw_only=True):
    """A user's role in a scope, and how it was set (a group never rewrites a hand's)."""

    user: str  # the user's id
    scope: Scope
    role: MemberRole
    set_by: SetBy = "hand"
    group: str = ""  # the group whose rule set it, for set_by "group"
    # set_by "group": the role each source's groups give here (role is the strongest); a
    # source takes away only its own ({}: from before sources were kept, any source may)
    sources: dict[GroupSource, MemberRole] = {}
    updated_at: float = 0.0


class Staff(msgspec.Struct, frozen=True, kw_only=True):
    """A user's cluster staff role: admin (everything), operator (models, nodes, mirror,
    Slurm), viewer (reads everything, changes nothing)."""

    user: str
    role: StaffRole
    updated_at: float = 0.0
