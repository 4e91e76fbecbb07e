"""/api/v1's keys of people: a user's own (/me/keys), and a project's (each member makes keys
for themselves in it, its managers make its service keys); a key has its maker's rights,
narrowed to its project, never more."""

from __future__ import annotations

import logging

from aiohttp import web

from llmgw.api_types import PersonKeyIn
from llmgw.api_types import PersonKeyView as PersonKeyView  # re-exported: the answers' type
from llmgw.errors import ApiError
from llmgwd import auth
from llmgwd.api.base import api_context, bad_field, json_response, not_found, read_body
from llmgwd.api.route import Route
from llmgwd.auth import STAFF_READ, Principal, Rule, org_rule
from llmgwd.catalog import ApiKey, KeyOwner, looks_like_key_id
from llmgwd.people.directory import Directory

log = logging.getLogger(__name__)


def view(key: ApiKey, secret: str = "") -> PersonKeyView:
    """A key as its maker and its project's managers see it."""
    return PersonKeyView(
        id=key.id,
        name=key.name,
        prefix=key.prefix,
        user=key.user,
        org=key.org,
        project=key.project,
        service=key.service,
        created_at=key.created_at,
        revoked=key.revoked,
        limits=key.limits,
        key=secret,
    )


def _all(request: web.Request) -> list[ApiKey]:
    return api_context(request).catalog.keys()


def _who(request: web.Request) -> Principal:
    return auth.principal_of(request, api_context(request).catalog)


def _maker(request: web.Request) -> str:
    """The calling user's id; the Unix socket and keys of no user make none of these keys."""
    who = _who(request)
    if not who.user:
        raise ApiError(
            400,
            f"{who.label} is no user: a person's key is made by that person (the Unix socket "
            "and admin keys make keys with POST /api/v1/keys)",
            "invalid_request_error",
            "no_user",
        )
    return who.user


async def _make(request: web.Request, owner: KeyOwner) -> web.Response:
    body = await read_body(request, PersonKeyIn)
    name = body.name.strip()
    if not name or len(name) > 64 or not name.isprintable():
        raise bad_field("name", "must be 1-64 printable characters")
    if looks_like_key_id(name):
        raise bad_field("name", "must not look like a key's id (12 hex digits)")
    catalog = api_context(request).catalog
    mine = (owner.user, owner.org, owner.project)
    if any(
        k.name == name and not k.revoked and (k.user, k.org, k.project) == mine
        for k in _all(request)
    ):
        raise ApiError(409, f"you have a key named {name!r} here", "conflict_error", "key_exists")
    key, secret = await catalog.create_key(name, "user", owner=owner)
    log.info("key %s (%s) made by %s", key.id, key.name, _who(request).label)
    return json_response(view(key, secret), 201)


async def _project(request: web.Request) -> tuple[str, str]:
    org, name = request.match_info["org"], request.match_info["project"]
    projects = await Directory(api_context(request).catalog.store).projects(org)
    if not any(p.name == name for p in projects):
        raise not_found("project", f"{org}/{name}")
    return org, name


async def _revoke(request: web.Request, key: ApiKey | None, ident: str) -> web.Response:
    if key is None:
        raise not_found("key", ident)
    if not key.revoked:
        key = await api_context(request).catalog.revoke_key(key.id)
        log.info("key %s (%s) revoked by %s", key.id, key.name, _who(request).label)
    return json_response(view(key))


def _one(keys: list[ApiKey], ident: str) -> ApiKey | None:
    """The key of these with this id, else the one active key of this name."""
    by_id = [k for k in keys if k.id == ident]
    named = [k for k in keys if k.name == ident and not k.revoked]
    found = by_id or named
    return found[0] if found else None


# The caller's own keys


async def my_keys(request: web.Request) -> web.Response:
    """GET /me/keys: the caller's keys, staff and project ones, oldest first."""
    user = _who(request).user
    keys = [k for k in _all(request) if user and k.user == user]
    return json_response([view(k) for k in keys])


async def create_my_key(request: web.Request) -> web.Response:
    """POST /me/keys {name}: a staff user's key, with their staff role (looked up at each
    request, so it never outlives the role)."""
    return await _make(request, KeyOwner(user=_maker(request)))


async def revoke_my_key(request: web.Request) -> web.Response:
    """DELETE /me/keys/{key}: one of the caller's keys, by id or name."""
    user, ident = _who(request).user, request.match_info["key"]
    mine = [k for k in _all(request) if user and k.user == user]
    return await _revoke(request, _one(mine, ident), ident)


async def revoke_this_key(request: web.Request) -> web.Response:
    """DELETE /me/key: the person's key this request came with (`llmgw logout` ends its
    session's key on the server too)."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    key = (
        api_context(request).catalog.authenticate(secret.strip())
        if scheme.lower() == "bearer"
        else None
    )
    if key is None or not key.user:
        raise ApiError(
            400,
            f"{_who(request).label} is no person's key: DELETE /api/v1/me/key revokes the "
            "person's key it is sent with",
            "invalid_request_error",
            "not_a_person_key",
        )
    return await _revoke(request, key, key.id)


# A project's keys


def _of_project(request: web.Request, org: str, project: str) -> list[ApiKey]:
    return [k for k in _all(request) if (k.org, k.project) == (org, project)]


async def project_keys(request: web.Request) -> web.Response:
    """GET /orgs/{org}/projects/{project}/keys: every key of the project (its managers')."""
    org, project = await _project(request)
    return json_response([view(k) for k in _of_project(request, org, project)])


async def create_project_key(request: web.Request) -> web.Response:
    """POST /orgs/{org}/projects/{project}/keys {name}: the caller's own key in the project."""
    org, project = await _project(request)
    return await _make(request, KeyOwner(user=_maker(request), org=org, project=project))


async def create_service_key(request: web.Request) -> web.Response:
    """POST /orgs/{org}/projects/{project}/service-keys {name}: a service key of the project,
    made by one of its managers (with that manager's rights in the project, never more)."""
    org, project = await _project(request)
    owner = KeyOwner(user=_maker(request), org=org, project=project, service=True)
    return await _make(request, owner)


async def revoke_project_key(request: web.Request) -> web.Response:
    """DELETE /orgs/{org}/projects/{project}/keys/{key}: any key of the project."""
    org, project = await _project(request)
    ident = request.match_info["key"]
    return await _revoke(request, _one(_of_project(request, org, project), ident), ident)


# Who passes: the caller's own keys, any user; a staff key, a staff user; a project's, its
# members make their own, its managers see, revoke and make service keys.
SELF = Rule(STAFF_READ.staff, user=True)
SELF_WRITE = Rule(STAFF_READ.staff)  # POST /me/keys: a staff user, whatever their role
MANAGER = org_rule("manager")
_PROJECT = "/orgs/{org}/projects/{project}"
_KEY, _KEYS, _IN = PersonKeyView, list[PersonKeyView], PersonKeyIn
TABLE: list[Route] = [
    Route("GET", "/me/keys", my_keys, SELF, answer=_KEYS),
    Route("POST", "/me/keys", create_my_key, SELF_WRITE, _IN, _KEY, status=201),
    Route("DELETE", "/me/keys/{key}", revoke_my_key, SELF, answer=_KEY),
    Route("DELETE", "/me/key", revoke_this_key, SELF, answer=_KEY),
    Route("GET", _PROJECT + "/keys", project_keys, org_rule("manager", read=True), answer=_KEYS),
    Route("POST", _PROJECT + "/keys", create_project_key, org_rule("member"), _IN, _KEY, 201),
    Route("POST", _PROJECT + "/service-keys", create_service_key, MANAGER, _IN, _KEY, 201),
    Route("DELETE", _PROJECT + "/keys/{key}", revoke_project_key, MANAGER, answer=_KEY),
]
