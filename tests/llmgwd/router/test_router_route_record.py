"""Each /v1 route the engines serve has one record (router/v1_routes.py), and the concerns a
request passes through take it as given: none of them imports a route's own module."""

from __future__ import annotations

import ast
from pathlib import Path

from llmgwd.router import Router, v1_routes
from llmgwd.router.route import NO_TOKENS
from tests.llmgwd.router.test_router_v1 import FakeKeys, FakeModels, FakePool

ROUTER = Path(v1_routes.__file__).parent
ROUTE_MODULES = {"messages", "responses", "rerank", "embeddings", "transcriptions",
                 "anthropic_errors", "responses_errors", "v1_routes"}  # fmt: skip
# The concerns every request passes through, which must see a route only as its record.
CONCERNS = ("proxy", "answers", "native_answers", "folding", "engine_refusals", "usage_events",
            "isolation", "route")  # fmt: skip


def _imports(module: str) -> set[str]:
    """The llmgwd.router modules a router module imports (anywhere in it)."""
    found: set[str] = set()
    tree = ast.parse((ROUTER / f"{module}.py").read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        if node.module == "llmgwd.router":
            found |= {alias.name for alias in node.names}
        elif node.module.startswith("llmgwd.router."):
            found.add(node.module.removeprefix("llmgwd.router."))
    return found


def test_no_concern_imports_a_route_s_own_module() -> None:
    for concern in CONCERNS:
        assert not _imports(concern) & ROUTE_MODULES, concern


def test_every_post_route_of_v1_has_its_record() -> None:
    router = Router(FakeKeys(), FakeModels(), FakePool())
    served = {
        r.resource.canonical.removeprefix("/")
        for r in router.app.router.routes()
        if r.method == "POST" and r.resource is not None
    }
    assert served == set(v1_routes.ROUTES)
    for path, route in v1_routes.ROUTES.items():
        assert route.path == path == route.words.path
        # a generating route is folded for a whole answer, and its streams' tokens counted
        assert (route.fold is not None) == (route.tokens is not NO_TOKENS), path
