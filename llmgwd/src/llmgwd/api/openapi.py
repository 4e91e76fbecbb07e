"""/api/v1/openapi.json: an OpenAPI 3.1 document made from the route records (api.route.Route:
each route's rule, request and answer types, status and checked path parameters) with
msgspec's JSON Schemas of the types; every error in the one error body."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec
from aiohttp import web

from llmgw.api_types import ErrorAnswer
from llmgwd.api.base import API_PREFIX, api_context, json_response
from llmgwd.api.route import ROUTES, Route
from llmgwd.api.route import plain_path as plain_path  # the tests' name for it

_REF = "#/components/schemas/{name}"
_ERRORS = ("400", "401", "403", "404", "409", "503")


def parameters(route: Route) -> list[dict[str, Any]]:
    """A route's path parameters, each with its schema (a {p:a|b} parameter: those words)."""
    out = []
    for name, pattern in re.findall(r"\{(\w+)(?::([^}]*))?\}", route.path):
        schema = route.params.get(name, {"type": "string"})
        if re.fullmatch(r"\w+(\|\w+)*", pattern):
            schema = {"type": "string", "enum": pattern.split("|")}
        out.append({"name": name, "in": "path", "required": True, "schema": schema})
    return out


def _json(schema: dict[str, Any], what: str) -> dict[str, Any]:
    return {"description": what, "content": {"application/json": {"schema": schema}}}


def _operation(route: Route, schemas: dict[Any, Any]) -> dict[str, Any]:
    """One route's operation: its parameters, body, answers and who may call it."""
    request, answer, rule = route.request, route.answer, route.rule
    ok = _json(schemas[answer], "done") if answer is not None else {"description": "done"}
    op: dict[str, Any] = {
        "operationId": f"{route.method.lower()} {route.plain}",
        "parameters": parameters(route),
        "responses": {str(route.status): ok}
        | {code: {"$ref": "#/components/responses/Error"} for code in _ERRORS + route.errors},
        "x-staff-roles": sorted(rule.staff),
    }
    if rule.member is not None:
        op["x-member-role"] = rule.member
    if route.deprecated:
        op["deprecated"] = True
    if request is not None:
        # No body reads as {} (api.base.read_body): one is required only if a field is.
        required = any(f.required for f in msgspec.structs.fields(request))
        op["requestBody"] = {"required": required, **_json(schemas[request], "the request")}
    return op


def document(table: Sequence[Route], version: str) -> dict[str, Any]:
    """The OpenAPI document of these routes."""
    typed = sorted({t for r in table for t in (r.request, r.answer) if t is not None}, key=repr)
    found, components = msgspec_schemas([ErrorAnswer, *typed])
    schemas = dict(zip([ErrorAnswer, *typed], found, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for route in table:
        paths.setdefault(API_PREFIX + route.plain, {})[route.method.lower()] = _operation(
            route, schemas
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
    """GET /openapi.json: this API's OpenAPI document, of the routes it is served from."""
    return json_response(document(request.config_dict[ROUTES], api_context(request).version))
