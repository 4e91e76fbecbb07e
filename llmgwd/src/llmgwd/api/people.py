"""/api/v1's people: organizations, their teams, projects and members, users and staff roles;
each route's record (api.route.Route: its rule, body and answer) in TABLE, which api.routes
serves, each behind its guard."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
from aiohttp import web

from llmgw.api_types import (
    Deleted,
    MemberRemoved,
    MembershipView,
    NamedIn,
    OrgView,
    ProjectIn,
    ProjectView,
    RoleIn,
    StaffIn,
    StaffView,
    TeamView,
    UserChange,
    UserDeleted,
    UserIn,
    UserView,
)
from llmgw.errors import ApiError
from llmgwd import auth
from llmgwd.api.base import api_context, bad_field, json_response, not_found, read_body
from llmgwd.api.route import Route
from llmgwd.auth import STAFF_ADMIN, STAFF_READ, Principal, Rule, org_rule
from llmgwd.people.directory import Directory
from llmgwd.people.records import MemberRole, Scope, User
from llmgwd.people.rules import PeopleError, rank

log = logging.getLogger(__name__)
Handler = Callable[[web.Request, Principal], Awaitable[web.Response]]
_STATUS = {"not_found": (404, "not_found_error"), "conflict": (409, "conflict_error"),
           "forbidden": (403, "permission_error")}  # fmt: skip


def _dir(request: web.Request) -> Directory:
    return Directory(api_context(request).catalog.store)


def _api_error(e: PeopleError) -> ApiError:
    if e.kind == "invalid":
        return bad_field(e.param or "body", str(e).partition(": ")[2] or str(e))
    status, type_ = _STATUS[e.kind]
    return ApiError(status, str(e), type_, e.kind)


async def _user(request: web.Request) -> User:
    ident = request.match_info["user"]
    found = await _dir(request).user(ident)
    if found is None:
        raise not_found("user", ident)
    return found


def _scope(request: web.Request) -> Scope:
    m = request.match_info
    if "team" in m:
        return Scope(org=m["org"], kind="team", name=m["team"])
    if "project" in m:
        return Scope(org=m["org"], kind="project", name=m["project"])
    return Scope(org=m["org"])


V = TypeVar("V", bound=msgspec.Struct)


def view(record: msgspec.Struct, kind: type[V]) -> V:
    """A stored record as its /api/v1 answer type (llmgw.api_types): the same fields."""
    return msgspec.convert(record, kind, from_attributes=True)


# Organizations, teams, projects


async def list_orgs(request: web.Request, who: Principal) -> web.Response:
    """GET /orgs: every one to staff; to a user, those they are a member of (a key narrowed
    to a project: that project's)."""
    people = _dir(request)
    orgs = await people.orgs()
    staff = who.staff or (who.user and not who.project and await people.staff_role(who.user))
    if staff:
        return json_response([view(o, OrgView) for o in orgs])
    mine = await people.orgs_of(who.user) if who.user else set()
    if who.project:
        mine &= {who.org}
    return json_response([view(o, OrgView) for o in orgs if o.name in mine])


async def create_org(request: web.Request, who: Principal) -> web.Response:
    """POST /orgs {name, title?}"""
    body = await read_body(request, NamedIn)
    org = await _dir(request).create_org(body.name, body.title)
    log.info("organization %s made by %s", org.name, who.label)
    return json_response(view(org, OrgView), 201)


async def get_org(request: web.Request, _who: Principal) -> web.Response:
    """GET /orgs/{org}"""
    name = request.match_info["org"]
    org = await _dir(request).org(name)
    if org is None:
        raise not_found("organization", name)
    return json_response(view(org, OrgView))


async def delete_org(request: web.Request, who: Principal) -> web.Response:
    """DELETE /orgs/{org}: with its teams, projects and memberships."""
    name = request.match_info["org"]
    await _dir(request).delete_org(name)
    log.info("organization %s deleted by %s", name, who.label)
    return json_response(Deleted(name=name, deleted=True))


async def list_teams(request: web.Request, _who: Principal) -> web.Response:
    """GET /orgs/{org}/teams"""
    teams = await _dir(request).teams(request.match_info["org"])
    return json_response([view(t, TeamView) for t in teams])


async def create_team(request: web.Request, who: Principal) -> web.Response:
    """POST /orgs/{org}/teams {name, title?}"""
    body = await read_body(request, NamedIn)
    team = await _dir(request).create_team(request.match_info["org"], body.name, body.title)
    log.info("team %s/%s made by %s", team.org, team.name, who.label)
    return json_response(view(team, TeamView), 201)


async def delete_team(request: web.Request, who: Principal) -> web.Response:
    """DELETE /orgs/{org}/teams/{team}"""
    org, team = request.match_info["org"], request.match_info["team"]
    await _dir(request).delete_team(org, team)
    log.info("team %s/%s deleted by %s", org, team, who.label)
    return json_response(Deleted(name=team, deleted=True))


async def list_projects(request: web.Request, _who: Principal) -> web.Response:
    """GET /orgs/{org}/projects"""
    projects = await _dir(request).projects(request.match_info["org"])
    return json_response([view(p, ProjectView) for p in projects])


async def create_project(request: web.Request, who: Principal) -> web.Response:
    """POST /orgs/{org}/projects {name, team?, title?}"""
    body = await read_body(request, ProjectIn)
    org = request.match_info["org"]
    project = await _dir(request).create_project(org, body.name, body.team, body.title)
    log.info("project %s/%s made by %s", org, project.name, who.label)
    return json_response(view(project, ProjectView), 201)


async def delete_project(request: web.Request, who: Principal) -> web.Response:
    """DELETE /orgs/{org}/projects/{project}"""
    org, project = request.match_info["org"], request.match_info["project"]
    await _dir(request).delete_project(org, project)
    log.info("project %s/%s deleted by %s", org, project, who.label)
    return json_response(Deleted(name=project, deleted=True))


# Memberships


async def list_members(request: web.Request, _who: Principal) -> web.Response:
    """GET /orgs/{org}/members: in the organization, its teams and its projects."""
    members = await _dir(request).members(request.match_info["org"])
    return json_response([view(m, MembershipView) for m in members])


async def set_member(request: web.Request, who: Principal) -> web.Response:
    """PUT /orgs/{org}[/teams/{team}|/projects/{project}]/members/{user} {role}: by hand."""
    body = await read_body(request, RoleIn)
    user, scope = await _user(request), _scope(request)
    await _not_above_own(request, who, body.role)
    kept = await _dir(request).set_member(who.user, user.id, scope, body.role)
    log.info("%s is %s of %s %s/%s, by %s", user.name, kept.role, scope.kind, scope.org,
             scope.name, who.label)  # fmt: skip
    return json_response(view(kept, MembershipView))


async def _not_above_own(request: web.Request, who: Principal, role: MemberRole) -> None:
    """A user (not staff) gives no role stronger than their own over the path: a team's
    manager cannot make anyone, themselves included, the team's admin."""
    if who.staff == "admin" or not who.user:
        return
    m = request.match_info
    held = await _dir(request).role_in(who.user, m["org"], m.get("team", ""), m.get("project", ""))
    if rank(role) > rank(held):
        why = f"{who.label} holds {held} here and may not give the stronger role {role}"
        raise ApiError(403, why, "permission_error", "role_above_own")


async def remove_member(request: web.Request, who: Principal) -> web.Response:
    """DELETE .../members/{user}"""
    user, scope = await _user(request), _scope(request)
    if not await _dir(request).remove_member(who.user, user.id, scope):
        raise not_found("membership", f"{user.name} in {scope.org}/{scope.name}".rstrip("/"))
    log.info("%s left %s %s/%s, by %s", user.name, scope.kind, scope.org, scope.name, who.label)
    return json_response(MemberRemoved(user=user.id, removed=True))


# Users and staff


async def list_users(request: web.Request, _who: Principal) -> web.Response:
    """GET /users"""
    return json_response([view(u, UserView) for u in await _dir(request).users()])


async def create_user(request: web.Request, who: Principal) -> web.Response:
    """POST /users {name, email?, external_id?}: a user made by staff."""
    body = await read_body(request, UserIn)
    user = await _dir(request).create_user(body.name, body.email, "staff", body.external_id)
    log.info("user %s (%s) made by %s", user.id, user.name, who.label)
    return json_response(view(user, UserView), 201)


async def get_user(request: web.Request, _who: Principal) -> web.Response:
    """GET /users/{user}: by id or name."""
    return json_response(view(await _user(request), UserView))


async def change_user(request: web.Request, who: Principal) -> web.Response:
    """PATCH /users/{user} {email?, active?, external_id?}"""
    body = await read_body(request, UserChange)
    changes = {k: v for k, v in msgspec.structs.asdict(body).items() if v is not None}
    user = await _dir(request).change_user((await _user(request)).id, **changes)
    api_context(request).catalog.note_user(user)  # a deactivated user's keys stop here at once
    log.info("user %s (%s) changed (%s) by %s", user.id, user.name, ", ".join(changes), who.label)
    return json_response(view(user, UserView))


async def approve_user(request: web.Request, who: Principal) -> web.Response:
    """POST /users/{user}/approve: an account waiting for staff's approval (made at a sign-in
    under oidc.approval_required) signs in from now on; one approved already stays so."""
    user = await _user(request)
    if not user.approved:
        user = await _dir(request).change_user(user.id, approved=True)
        api_context(request).catalog.note_user(user)
        log.info("user %s (%s) approved by %s", user.id, user.name, who.label)
    return json_response(view(user, UserView))


async def delete_user(request: web.Request, who: Principal) -> web.Response:
    """DELETE /users/{user}: with their memberships, staff role and limits; their keys are
    refused at once here (and on every control plane by the catalog's watch), then revoked."""
    user = await _dir(request).delete_user((await _user(request)).id)
    catalog = api_context(request).catalog
    catalog.note_user(msgspec.structs.replace(user, active=False))
    for key in catalog.keys():  # noqa: SIM118 (a Catalog, no dict)
        if key.user == user.id and not key.revoked:
            await catalog.revoke_key(key.id)
    log.info("user %s (%s) deleted by %s", user.id, user.name, who.label)
    return json_response(UserDeleted(user=user.id, deleted=True))


async def set_staff(request: web.Request, who: Principal) -> web.Response:
    """PUT /users/{user}/staff {role}: admin, operator, viewer, or null for none."""
    body = await read_body(request, StaffIn)
    user = await _user(request)
    await _dir(request).set_staff(user.id, body.role)
    log.info("user %s (%s) staff role %s, by %s", user.id, user.name, body.role, who.label)
    return json_response(StaffView(user=user.id, staff=body.role))


def plain(handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
    """handler as a route's (the principal the route's guard let in, its PeopleError as an
    answer)."""

    async def run(request: web.Request) -> web.Response:
        who = auth.principal_of(request, api_context(request).catalog)
        try:
            return await handler(request, who)
        except PeopleError as e:
            raise _api_error(e) from None

    return run


# The route table: every route, who passes it, what it takes and answers.

MEMBER_READ = org_rule("member", read=True)
ORG_ADMIN = org_rule("admin")
MANAGER = org_rule("manager")  # of the team or project the path names, or the org's
SIGNED_IN = Rule(STAFF_READ.staff, user=True)  # staff, and every user (their own answer)
CREATED = 201
_TEAM, _PROJECT = "/orgs/{org}/teams/{team}", "/orgs/{org}/projects/{project}"
_MEMBER = "/members/{user}"
_set_member, _remove_member = plain(set_member), plain(remove_member)

TABLE: list[Route] = [
    Route("GET", "/orgs", plain(list_orgs), SIGNED_IN, answer=list[OrgView]),
    Route("POST", "/orgs", plain(create_org), STAFF_ADMIN, NamedIn, OrgView, CREATED),
    Route("GET", "/orgs/{org}", plain(get_org), MEMBER_READ, answer=OrgView),
    Route("DELETE", "/orgs/{org}", plain(delete_org), STAFF_ADMIN, answer=Deleted),
    Route("GET", "/orgs/{org}/teams", plain(list_teams), MEMBER_READ, answer=list[TeamView]),
    Route("POST", "/orgs/{org}/teams", plain(create_team), ORG_ADMIN, NamedIn, TeamView, CREATED),
    Route("DELETE", _TEAM, plain(delete_team), ORG_ADMIN, answer=Deleted),
    Route(
        "GET", "/orgs/{org}/projects", plain(list_projects), MEMBER_READ, answer=list[ProjectView]
    ),
    Route(
        "POST",
        "/orgs/{org}/projects",
        plain(create_project),
        ORG_ADMIN,
        ProjectIn,
        ProjectView,
        CREATED,
    ),
    Route("DELETE", _PROJECT, plain(delete_project), ORG_ADMIN, answer=Deleted),
    Route(
        "GET", "/orgs/{org}/members", plain(list_members), MEMBER_READ, answer=list[MembershipView]
    ),
    Route("PUT", "/orgs/{org}" + _MEMBER, _set_member, ORG_ADMIN, RoleIn, MembershipView),
    Route("DELETE", "/orgs/{org}" + _MEMBER, _remove_member, ORG_ADMIN, answer=MemberRemoved),
    Route("PUT", _TEAM + _MEMBER, _set_member, MANAGER, RoleIn, MembershipView),
    Route("DELETE", _TEAM + _MEMBER, _remove_member, MANAGER, answer=MemberRemoved),
    Route("PUT", _PROJECT + _MEMBER, _set_member, MANAGER, RoleIn, MembershipView),
    Route("DELETE", _PROJECT + _MEMBER, _remove_member, MANAGER, answer=MemberRemoved),
    Route("GET", "/users", plain(list_users), STAFF_READ, answer=list[UserView]),
    Route("POST", "/users", plain(create_user), STAFF_ADMIN, UserIn, UserView, CREATED),
    Route("GET", "/users/{user}", plain(get_user), STAFF_READ, answer=UserView),
    Route("PATCH", "/users/{user}", plain(change_user), STAFF_ADMIN, UserChange, UserView),
    Route("DELETE", "/users/{user}", plain(delete_user), STAFF_ADMIN, answer=UserDeleted),
    Route("PUT", "/users/{user}/staff", plain(set_staff), STAFF_ADMIN, StaffIn, StaffView),
    Route("POST", "/users/{user}/approve", plain(approve_user), STAFF_ADMIN, answer=UserView),
]
