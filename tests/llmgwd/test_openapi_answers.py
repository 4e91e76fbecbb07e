"""Every /api/v1 route in routes.TABLE that answers JSON says in /api/v1/openapi.json what
its 2xx answer is: a new route without an answer type fails here."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from llmgw import api_types
from llmgwd.api import openapi, people, routes
from llmgwd.api.base import API_PREFIX
from llmgwd.people import records

# The routes that answer no JSON (a 204, a file, text): none today.
NO_JSON: set[tuple[str, str]] = set()


def _ok(doc: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    """The route's one 2xx answer in the document."""
    answers = doc["paths"][API_PREFIX + path][method.lower()]["responses"]
    [ok] = [a for code, a in answers.items() if code.startswith("2")]
    return dict(ok)


def _table() -> set[tuple[str, str]]:
    return {(r.method, openapi.plain_path(r.path)) for r in routes.TABLE}


def _undescribed() -> set[tuple[str, str]]:
    doc = openapi.document(routes.TABLE, "test")
    return {
        (m, p)
        for m, p in _table()
        if "schema" not in _ok(doc, m, p).get("content", {}).get("application/json", {})
    }


def test_every_json_route_has_an_answer_schema() -> None:
    missing = _undescribed() - NO_JSON
    assert not missing, f"routes with no answer type in their Route record: {sorted(missing)}"


def test_the_allow_list_holds_only_routes_still_undescribed() -> None:
    # A route of NO_JSON that answers a described type now leaves the set.
    done = (NO_JSON & _table()) - _undescribed()
    assert not done, f"described now, remove from NO_JSON: {sorted(done)}"


def test_the_answers_of_the_non_people_routes_are_named_types() -> None:
    doc = openapi.document(routes.TABLE, "test")
    for m, p in [("GET", "/status"), ("GET", "/nodes"), ("GET", "/usage"), ("GET", "/slurm")]:
        schema = _ok(doc, m, p)["content"]["application/json"]["schema"]
        ref = schema.get("$ref") or schema["items"]["$ref"]
        assert ref.split("/")[-1] in doc["components"]["schemas"]


def test_the_people_answers_are_named_types() -> None:
    doc = openapi.document(routes.TABLE, "test")
    for m, p, name in [
        ("GET", "/orgs", "OrgView"),
        ("GET", "/orgs/{org}/members", "MembershipView"),
        ("DELETE", "/orgs/{org}/teams/{team}/members/{user}", "MemberRemoved"),
        ("PUT", "/users/{user}/staff", "StaffView"),
        ("POST", "/orgs/{org}/projects/{project}/service-keys", "PersonKeyView"),
    ]:
        schema = _ok(doc, m, p)["content"]["application/json"]["schema"]
        ref = schema.get("$ref") or schema["items"]["$ref"]
        assert ref.split("/")[-1] == name, (m, p)


RECORD_VIEWS = [
    (records.Org, api_types.OrgView),
    (records.Team, api_types.TeamView),
    (records.Project, api_types.ProjectView),
    (records.User, api_types.UserView),
    (records.Membership, api_types.MembershipView),
]
EXAMPLES: dict[type, Any] = {
    records.Org: records.Org(name="acme", title="ACME", created_at=1.5),
    records.Team: records.Team(org="acme", name="ml", title="ML", created_at=2.5),
    records.Project: records.Project(org="acme", name="chat", team="ml", title="C", created_at=3.5),
    records.User: records.User(
        id="a" * 12,
        name="ann",
        email="a@b",
        source="scim",
        active=False,
        created_at=4.5,
        external_id="00u1ann",
    ),
    records.Membership: records.Membership(
        user="a" * 12,
        scope=records.Scope(org="acme", kind="team", name="ml"),
        role="manager",
        set_by="group",
        group="ml-leads",
        sources={"oidc": "manager"},
        updated_at=5.5,
    ),
}


@pytest.mark.parametrize("record, view_type", RECORD_VIEWS, ids=lambda x: x.__name__)
def test_a_people_answer_is_its_record_as_it_was_answered(record: type, view_type: type) -> None:
    # the handlers answered the stored records themselves: their JSON is the contract
    example = EXAMPLES[record]
    answered = msgspec.json.decode(msgspec.json.encode(people.view(example, view_type)))
    assert answered == msgspec.json.decode(msgspec.json.encode(example))
    assert isinstance(people.view(example, view_type), view_type)
