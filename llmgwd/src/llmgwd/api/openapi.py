"""/api/v1/openapi.json: an OpenAPI 3.1 document made from the route table and the routes'
request and answer types (msgspec's JSON Schema); every error in the one error body."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec
from aiohttp import web

from llmgw.api_types import (
    Deleted,
    ErrorAnswer,
    MemberRemoved,
    MembershipView,
    MetricsTokenView,
    ModelRemoved,
    NodeFlagsView,
    NodeRemoved,
    NodeView,
    OrgView,
    PersonKeyView,
    PlanView,
    ProjectView,
    ScimTokenView,
    ServerRemoved,
    ServerView,
    SlurmView,
    StaffView,
    StatusView,
    TeamView,
    TokenView,
    UploadView,
    UsageReport,
    UserDeleted,
    UserView,
)
from llmgw.mirror_api import (
    ImportIn,
    ImportOut,
    MirrorStatus,
    PeerIn,
    PeerView,
    SweepIn,
    SweepOut,
)
from llmgwd.accounting.views import LimitsIn, PriceIn
from llmgwd.api import keys, level_limits, models, people, person_keys, servers
from llmgwd.api.base import API_PREFIX, _ctx, json_response
from llmgwd.auth import Rule
from llmgwd.slurm.settings import SlurmSettingsIn

# (method, path): (request body type or None, answer type or None: no JSON answer, which
# tests/llmgwd/test_openapi_answers.py allows only for the routes it lists)
SHAPES: dict[tuple[str, str], tuple[Any, Any]] = {
    ("GET", "/status"): (None, StatusView),
    ("GET", "/openapi.json"): (None, dict[str, Any]),  # this document
    ("GET", "/models"): (None, list[models.ModelView]),
    ("POST", "/models"): (models.ModelIn, models.ModelView),
    ("GET", "/models/{name}"): (None, models.ModelView),
    ("POST", "/models/{name}/serve"): (models.ServeIn, models.ModelView),
    ("POST", "/models/{name}/stop"): (None, models.ModelView),
    ("POST", "/models/{name}/replicas"): (models.ProfileReplicasIn, models.ModelView),
    ("PUT", "/models/{name}/context"): (models.ContextIn, models.ModelView),
    ("GET", "/models/{name}/plan"): (None, PlanView),
    ("DELETE", "/models/{name}"): (None, ModelRemoved),
    ("PUT", "/models/{name}/price"): (PriceIn, models.ModelView),
    ("GET", "/nodes"): (None, list[NodeView]),
    ("POST", "/nodes/{name}/{action}"): (None, NodeFlagsView),
    ("DELETE", "/nodes/{name}"): (None, NodeRemoved),
    ("POST", "/tokens"): (None, TokenView),
    ("GET", "/keys"): (None, list[keys.KeyView]),
    ("POST", "/keys"): (keys.KeyIn, keys.NewKey),
    ("DELETE", "/keys/{key}"): (None, keys.KeyView),
    ("PATCH", "/keys/{key}/limits"): (LimitsIn, keys.KeyView),
    ("GET", "/usage"): (None, UsageReport),
    ("GET", "/orgs/{org}/usage"): (None, UsageReport),
    ("GET", "/mirror"): (None, MirrorStatus),
    ("PUT", "/mirror/uploads/{sha256}"): (None, UploadView),  # the body: the file's bytes
    ("POST", "/mirror/import"): (ImportIn, ImportOut),
    ("POST", "/mirror/sweep"): (SweepIn, SweepOut),
    ("GET", "/mirror/peers"): (None, list[PeerView]),
    ("POST", "/mirror/peers"): (PeerIn, PeerView),
    ("GET", "/slurm"): (None, SlurmView),
    ("PUT", "/slurm"): (SlurmSettingsIn, SlurmView),
    ("POST", "/slurm/nodes/{name}/{action}"): (None, SlurmView),
    ("GET", "/servers"): (None, list[ServerView]),
    ("POST", "/servers/tokens"): (servers.ServerTokenIn, TokenView),
    ("POST", "/servers/leave"): (servers.RemoveIn, ServerRemoved),
    ("DELETE", "/servers/{name}"): (servers.RemoveIn, ServerRemoved),
    ("POST", "/scim/token"): (None, ScimTokenView),
    ("POST", "/metrics/token"): (None, MetricsTokenView),
    ("GET", "/orgs"): (None, list[OrgView]),
    ("POST", "/orgs"): (people.NamedIn, OrgView),
    ("GET", "/orgs/{org}"): (None, OrgView),
    ("DELETE", "/orgs/{org}"): (None, Deleted),
    ("GET", "/orgs/{org}/teams"): (None, list[TeamView]),
    ("POST", "/orgs/{org}/teams"): (people.NamedIn, TeamView),
    ("DELETE", "/orgs/{org}/teams/{team}"): (None, Deleted),
    ("GET", "/orgs/{org}/projects"): (None, list[ProjectView]),
    ("POST", "/orgs/{org}/projects"): (people.ProjectIn, ProjectView),
    ("DELETE", "/orgs/{org}/projects/{project}"): (None, Deleted),
    ("GET", "/orgs/{org}/members"): (None, list[MembershipView]),
    ("GET", "/users"): (None, list[UserView]),
    ("POST", "/users"): (people.UserIn, UserView),
    ("GET", "/users/{user}"): (None, UserView),
    ("PATCH", "/users/{user}"): (people.UserChange, UserView),
    ("DELETE", "/users/{user}"): (None, UserDeleted),
    ("PUT", "/users/{user}/staff"): (people.StaffIn, StaffView),
    ("GET", "/me/keys"): (None, list[PersonKeyView]),
    ("POST", "/me/keys"): (person_keys.PersonKeyIn, PersonKeyView),
    ("DELETE", "/me/keys/{key}"): (None, PersonKeyView),
    ("GET", "/orgs/{org}/projects/{project}/keys"): (None, list[PersonKeyView]),
    ("POST", "/orgs/{org}/projects/{project}/keys"): (person_keys.PersonKeyIn, PersonKeyView),
    ("POST", "/orgs/{org}/projects/{project}/service-keys"): (
        person_keys.PersonKeyIn,
        PersonKeyView,
    ),
    ("DELETE", "/orgs/{org}/projects/{project}/keys/{key}"): (None, PersonKeyView),
}
for _scope in ("", "/teams/{team}", "/projects/{project}"):
    SHAPES[("PUT", f"/orgs/{{org}}{_scope}/members/{{user}}")] = (people.RoleIn, MembershipView)
    SHAPES[("DELETE", f"/orgs/{{org}}{_scope}/members/{{user}}")] = (None, MemberRemoved)
SHAPES.update(level_limits.SHAPES)

# The routes that answer 201 Created (the rest answer 200).
CREATED = {
    ("POST", p)
    for p in (
        "/models", "/tokens", "/keys", "/mirror/import", "/mirror/peers", "/orgs",
        "/orgs/{org}/teams", "/orgs/{org}/projects", "/users", "/me/keys",
        "/orgs/{org}/projects/{project}/keys", "/orgs/{org}/projects/{project}/service-keys",
        "/scim/token", "/metrics/token",
    )
} | {("PUT", "/mirror/uploads/{sha256}")}  # fmt: skip

# Path parameters the handlers check (the rest: any string; a {p:a|b} route: those words).
_NODE = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"}
PARAMS: dict[tuple[str, str], dict[str, Any]] = {
    ("/nodes/{name}", "name"): _NODE,
    ("/nodes/{name}/{action}", "name"): _NODE,
    ("/slurm/nodes/{name}/{action}", "name"): _NODE,
    ("/servers/{name}", "name"): _NODE | {"not": {"enum": ["tokens", "leave"]}},
    ("/mirror/uploads/{sha256}", "sha256"): {"type": "string", "pattern": "^[0-9a-f]{64}$"},
}

_REF = "#/components/schemas/{name}"
_ERRORS = ("400", "401", "403", "404", "409", "503")
# DELETE /servers/tokens and /servers/leave: the literal routes' 405 (their name is refused).
_MORE_ERRORS = {("DELETE", "/servers/{name}"): ("405",)}


def plain_path(path: str) -> str:
    """A route's path with its parameters' patterns dropped ({action:a|b} -> {action})."""
    return re.sub(r"\{(\w+):[^}]*\}", r"{\1}", path)


def parameters(raw: str) -> list[dict[str, Any]]:
    """A route's path parameters (raw: its path as the table has it), each with its schema."""
    out = []
    for name, pattern in re.findall(r"\{(\w+)(?::([^}]*))?\}", raw):
        schema = PARAMS.get((plain_path(raw), name), {"type": "string"})
        if re.fullmatch(r"\w+(\|\w+)*", pattern):
            schema = {"type": "string", "enum": pattern.split("|")}
        out.append({"name": name, "in": "path", "required": True, "schema": schema})
    return out


def _json(schema: dict[str, Any], what: str) -> dict[str, Any]:
    return {"description": what, "content": {"application/json": {"schema": schema}}}


def _operation(method: str, raw: str, rule: Rule, schemas: dict[Any, Any]) -> dict[str, Any]:
    """One route's operation: its parameters, body, answers and who may call it."""
    path = plain_path(raw)
    request, answer = SHAPES.get((method, path), (None, None))
    ok = _json(schemas[answer], "done") if answer is not None else {"description": "done"}
    status = "201" if (method, path) in CREATED else "200"
    op: dict[str, Any] = {
        "operationId": f"{method.lower()} {path}",
        "parameters": parameters(raw),
        "responses": {status: ok}
        | {
            code: {"$ref": "#/components/responses/Error"}
            for code in _ERRORS + _MORE_ERRORS.get((method, path), ())
        },
        "x-staff-roles": sorted(rule.staff),
    }
    if rule.member is not None:
        op["x-member-role"] = rule.member
    if request is not None:
        # No body reads as {} (api.base.read_body): one is required only if a field is.
        required = any(f.required for f in msgspec.structs.fields(request))
        op["requestBody"] = {"required": required, **_json(schemas[request], "the request")}
    return op


def document(table: Sequence[tuple[str, str, object, Rule]], version: str) -> dict[str, Any]:
    """The OpenAPI document of these routes (method, path under API_PREFIX, handler, rule)."""
    typed = sorted({t for pair in SHAPES.values() for t in pair if t is not None}, key=repr)
    found, components = msgspec_schemas([ErrorAnswer, *typed])
    schemas = dict(zip([ErrorAnswer, *typed], found, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for method, raw, _handler, rule in table:
        path = plain_path(raw)
        paths.setdefault(API_PREFIX + path, {})[method.lower()] = _operation(
            method, raw, rule, schemas
        )
    error = _json(schemas[ErrorAnswer], "an error, in /api/v1's one error body")
    return {
        "openapi": "3.1.0",
        "info": {"title": "llmgw /api/v1", "version": version},
        "paths": paths,
        "components": {
            "schemas": dict(sorted(components.items())),  # by name, not by where types live
            "responses": {"Error": error},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def msgspec_schemas(types: list[Any]) -> tuple[tuple[dict[str, Any], ...], dict[str, Any]]:
    """msgspec's JSON Schemas of types, referring to components named as OpenAPI wants."""
    return msgspec.json.schema_components(types, ref_template=_REF)


async def get_openapi(request: web.Request) -> web.Response:
    """GET /openapi.json: this API's OpenAPI document."""
    from llmgwd.api import routes  # the table holds this handler

    return json_response(document(routes.TABLE, _ctx(request).version))
