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
    org: str = ""  # with project: a project key's, narrowed to that project
    project: str = ""  # "": not narrowed (a user's own rights, staff role included)


@dataclass(frozen=True, slots=True)
class Rule:
    """Who passes a route: these staff roles, or (member set) a user holding at least that
    role in the path's organization (or in the team or project the path names)."""

    staff: frozenset[StaffRole]
    member: MemberRole | None = None
    user: bool = False  # every user passes (their own things: /me/...)


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

    async def staff_role(self, user: str) -> StaffRole | None:
        """user's staff role, or None."""
        ...


class KeyLookup(Protocol):
    """The catalog's key check."""

    def authenticate(self, secret: str) -> ApiKey | None:
        """The live key matching secret, or None."""
        ...


def of_key(key: ApiKey) -> Principal:
    """A key's principal: its maker's, narrowed to its project; a key of no maker (made before
    issue 13) is a staff admin if an admin key, else of no role (/v1 only)."""
    label = f"key {key.id} ({key.name})"
    if key.user:
        return Principal(label, user=key.user, org=key.org, project=key.project)
    return Principal(label, staff="admin" if key.role == "admin" else None)


def principal_of(request: web.Request, keys: KeyLookup) -> Principal:
    """The principal an auth middleware set, else the Unix socket's caller (its middleware
    admitted it), else the bearer key's, else nobody."""
    if PRINCIPAL in request:
        return request[PRINCIPAL]
    if peer_credentials(request) is not None:
        return LOCAL
    return of_bearer(request, keys)


def of_bearer(request: web.Request, keys: KeyLookup) -> Principal:
    """The principal of the request's bearer key (client port's key_auth), else nobody."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    key = keys.authenticate(secret.strip()) if scheme.lower() == "bearer" else None
    return of_key(key) if key is not None else NOBODY


async def allowed(who: Principal, rule: Rule, path: Mapping[str, str], roles: Roles) -> bool:
    """Whether who passes rule on a path with these parameters (org, team, project)."""
    if who.staff is not None and who.staff in rule.staff:
        return True
    if rule.user and who.user:
        return True
    if who.user and not who.project and await roles.staff_role(who.user) in rule.staff:
        return True  # a staff user's own key: their staff role, looked up now
    org = path.get("org", "")
    if rule.member is None or not who.user or not org or not _within(who, rule, path):
        return False
    held = await roles.role_in(who.user, org, path.get("team", ""), path.get("project", ""))
    return rank(held) >= rank(rule.member)


def _within(who: Principal, rule: Rule, path: Mapping[str, str]) -> bool:
    """Whether a path is inside the project who is narrowed to: that project's routes, and
    reads (rules staff viewers pass) of its organization's own; a principal not narrowed is
    inside everything."""
    if not who.project:
        return True
    if path.get("org") != who.org or path.get("team"):
        return False
    if "project" not in path:
        return "viewer" in rule.staff
    return path["project"] == who.project
