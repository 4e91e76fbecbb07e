"""One /api/v1 route as a record (method, path, handler, rule, request and answer types,
status): the route table (api.routes), each route's guard, the OpenAPI document (api.openapi)
and tests/llmgwd/test_route_roles.py are all made from these records."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from llmgwd.api.access import RouteHandler
from llmgwd.auth import Rule


@dataclass(frozen=True, slots=True)
class Route:
    """One route of /api/v1 and everything said of it."""

    method: str
    path: str  # under API_PREFIX, as aiohttp routes it ({action:a|b}: those words only)
    handler: RouteHandler
    rule: Rule  # who passes its guard (llmgwd.auth)
    request: Any = None  # the JSON body's type (api.base.read_body); None: no body is read
    answer: Any = None  # the 2xx answer's type; None: no JSON answer
    status: int = 200  # 201: it makes something
    # Path parameters the handler checks, each with its schema (the rest: any string).
    params: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    errors: tuple[str, ...] = ()  # error statuses it answers beyond every route's
    deprecated: bool = False  # an old path kept answering for old clients: use another

    @property
    def plain(self) -> str:
        """The path with its parameters' patterns dropped ({action:a|b} -> {action})."""
        return plain_path(self.path)


def old_paths(routes: Sequence[Route], new: str, old: str) -> list[Route]:
    """The routes again under their old path (new's prefix replaced by old), deprecated: the
    same handler, rule and types, so that clients of the old path keep working."""
    return [
        replace(r, path=old + r.path.removeprefix(new), deprecated=True)
        for r in routes
        if r.path.startswith(new)
    ]


def plain_path(path: str) -> str:
    """A route's path with its parameters' patterns dropped ({action:a|b} -> {action})."""
    return re.sub(r"\{(\w+):[^}]*\}", r"{\1}", path)


# The records the API is served from, for the handlers that describe it (GET /openapi.json).
ROUTES: web.AppKey[Sequence[Route]] = web.AppKey("llmgw.api.routes")
