"""Every /api/v1 route in routes.TABLE that answers JSON says in /api/v1/openapi.json what
its 2xx answer is: a new route without an answer type fails here."""

from __future__ import annotations

from typing import Any

from llmgwd.api import openapi, routes
from llmgwd.api.base import API_PREFIX

# The people routes whose answer types their owner adds (api/people.py, person_keys.py):
# remove each from this set as its type lands in openapi.SHAPES. Empty it; never grow it.
PEOPLE_PENDING = {
    ("GET", "/orgs"),
    ("POST", "/orgs"),
    ("GET", "/orgs/{org}"),
    ("DELETE", "/orgs/{org}"),
    ("GET", "/orgs/{org}/teams"),
    ("POST", "/orgs/{org}/teams"),
    ("DELETE", "/orgs/{org}/teams/{team}"),
    ("GET", "/orgs/{org}/projects"),
    ("POST", "/orgs/{org}/projects"),
    ("DELETE", "/orgs/{org}/projects/{project}"),
    ("GET", "/orgs/{org}/members"),
    ("PUT", "/orgs/{org}/members/{user}"),
    ("DELETE", "/orgs/{org}/members/{user}"),
    ("PUT", "/orgs/{org}/teams/{team}/members/{user}"),
    ("DELETE", "/orgs/{org}/teams/{team}/members/{user}"),
    ("PUT", "/orgs/{org}/projects/{project}/members/{user}"),
    ("DELETE", "/orgs/{org}/projects/{project}/members/{user}"),
    ("PUT", "/users/{user}/staff"),
    ("DELETE", "/users/{user}"),  # being added to api/people.py
    ("GET", "/me/keys"),
    ("POST", "/me/keys"),
    ("DELETE", "/me/keys/{key}"),
    ("GET", "/orgs/{org}/projects/{project}/keys"),
    ("POST", "/orgs/{org}/projects/{project}/keys"),
    ("POST", "/orgs/{org}/projects/{project}/service-keys"),
    ("DELETE", "/orgs/{org}/projects/{project}/keys/{key}"),
}
# The routes that answer no JSON (a 204, a file, text): none today.
NO_JSON: set[tuple[str, str]] = set()


def _ok(doc: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    """The route's one 2xx answer in the document."""
    answers = doc["paths"][API_PREFIX + path][method.lower()]["responses"]
    [ok] = [a for code, a in answers.items() if code.startswith("2")]
    return dict(ok)


def _table() -> set[tuple[str, str]]:
    return {(m, openapi.plain_path(p)) for m, p, _h, _r in routes.TABLE}


def _undescribed() -> set[tuple[str, str]]:
    doc = openapi.document(routes.TABLE, "test")
    return {
        (m, p)
        for m, p in _table()
        if "schema" not in _ok(doc, m, p).get("content", {}).get("application/json", {})
    }


def test_every_json_route_has_an_answer_schema() -> None:
    missing = _undescribed() - PEOPLE_PENDING - NO_JSON
    assert not missing, f"routes with no answer type in openapi.SHAPES: {sorted(missing)}"


def test_the_allow_lists_hold_only_routes_still_undescribed() -> None:
    # A route of PEOPLE_PENDING whose type has landed leaves the set (so the set only shrinks).
    done = ((PEOPLE_PENDING | NO_JSON) & _table()) - _undescribed()
    assert not done, f"described now, remove from the allow-lists: {sorted(done)}"


def test_the_answers_of_the_non_people_routes_are_named_types() -> None:
    doc = openapi.document(routes.TABLE, "test")
    for m, p in [("GET", "/status"), ("GET", "/nodes"), ("GET", "/usage"), ("GET", "/slurm")]:
        schema = _ok(doc, m, p)["content"]["application/json"]["schema"]
        ref = schema.get("$ref") or schema["items"]["$ref"]
        assert ref.split("/")[-1] in doc["components"]["schemas"]
