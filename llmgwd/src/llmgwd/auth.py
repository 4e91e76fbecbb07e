"""Who may do what: a request's principal (a key today, a user tomorrow) against a route's rule
(a staff role, or a membership role in the organization the path names)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from llmgw.localsock import peer_credentials
from llmgwd.catalog import ApiKey
from llmgwd.people.records import STAFF_ROLES, MemberRole, StaffRole
from llmgwd.people.rules import rank


@dataclass(frozen=True, slots=True)
class Principal:
    """Who calls: a staff role, and a user (whose memberships count) or none."""

    label: str  # for the log: "key ID (NAME)", "local", "user ID"; never a secret
    staff: StaffRole | None = None
    user: str = ""  # a user's id; "": a key of no user, or the local socket


@dataclass(frozen=True, slots=True)
class Rule:
    """Who passes a route: these staff roles, or (member set) a user holding at least that
    role in the path's organization (or in the team or project the path names)."""

    staff: frozenset[StaffRole]
    member: MemberRole | None = None


STAFF_ADMIN = Rule(frozenset({"admin"}))
STAFF_READ = Rule(frozenset(STAFF_ROLES))  # viewer, operator and admin read
STAFF_OPERATE = Rule(frozenset({"admin", "operator"}))  # models, nodes, mirror, Slurm
NOBODY = Principal("nobody")
LOCAL = Principal("local", staff="admin")  # the Unix socket's root or llmgw group
PRINCIPAL = web.RequestKey("llmgw.auth.principal", Principal)  # set by an auth middleware


def org_rule(member: MemberRole, *, read: bool = False) -> Rule:
    """Staff admins (and, for a read, every staff role) or the path org's member/manager/admin."""
    return Rule(STAFF_READ.staff if read else STAFF_ADMIN.staff, member)


class Roles(Protocol):
    """What the check asks of the people directory."""

    async def role_in(
        self, user: str, org: str, team: str = "", project: str = ""
    ) -> MemberRole | None:
        """user's strongest role over org, or the team or project of it named."""
        ...


class KeyLookup(Protocol):
    """The catalog's key check."""

    def authenticate(self, secret: str) -> ApiKey | None:
        """The live key matching secret, or None."""
        ...


def of_key(key: ApiKey) -> Principal:
    """A key's principal: an admin key is a staff admin; a user key has no role yet (keys of
    users, with their memberships, come with the rest of issue 13)."""
    return Principal(f"key {key.id} ({key.name})", staff="admin" if key.role == "admin" else None)


def principal_of(request: web.Request, keys: KeyLookup) -> Principal:
    """The principal an auth middleware set, else the Unix socket's caller (its middleware
    admitted it), else the bearer key's, else nobody."""
    if PRINCIPAL in request:
        return request[PRINCIPAL]
    if peer_credentials(request) is not None:
        return LOCAL
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    key = keys.authenticate(secret.strip()) if scheme.lower() == "bearer" else None
    return of_key(key) if key is not None else NOBODY


async def allowed(who: Principal, rule: Rule, path: Mapping[str, str], roles: Roles) -> bool:
    """Whether who passes rule on a path with these parameters (org, team, project)."""
    if who.staff is not None and who.staff in rule.staff:
        return True
    org = path.get("org", "")
    if rule.member is None or not who.user or not org:
        return False
    held = await roles.role_in(who.user, org, path.get("team", ""), path.get("project", ""))
    return rank(held) >= rank(rule.member)
