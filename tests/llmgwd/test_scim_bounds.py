"""/scim/v2 on hostile input: bad filters (in the query and in .search bodies), bodies nested
too deep, too large, or not JSON, and attributes over their bounds each get SCIM's error body
with the right status (never a 500), and nothing over a bound is stored."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgwd.scim.base import ERROR, MAX_BODY_BYTES, MAX_DEPTH, PATCH_OP, SEARCH
from llmgwd.scim.bounds import MAX_EMAIL, MAX_EXTERNAL_ID, MAX_NAME
from tests.llmgwd.test_scim import Scim, serving


@pytest.fixture
async def scim() -> AsyncIterator[Scim]:
    async with serving() as s:
        yield s


async def raw(scim: Scim, method: str, path: str, data: bytes) -> tuple[int, Any]:
    """A request with data as its body, as sent (not made JSON by the client)."""
    headers = {"Authorization": f"Bearer {scim.secret}", "Content-Type": "application/scim+json"}
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, scim.url + path, headers=headers, data=data) as r,
    ):
        assert r.content_type == "application/scim+json"
        return r.status, await r.json()


def refused(answer: Any, status: int, scim_type: str) -> bool:
    """answer is RFC 7644 3.12's error body with this status and scimType."""
    return bool(
        answer["schemas"] == [ERROR]
        and answer["status"] == str(status)
        and answer.get("scimType", "") == scim_type
        and answer["detail"]
    )


def _search(filter_: object) -> dict[str, object]:
    return {"schemas": [SEARCH], "filter": filter_}


def _given_name(value: str) -> dict[str, object]:
    op = {"op": "replace", "path": "name.givenName", "value": value}
    return {"schemas": [PATCH_OP], "Operations": [op]}


BAD_FILTERS = ['userName eq "\\q"', 'userName eq "\\u12"', 'userName eq "\\', "x" * 5000]


@pytest.mark.parametrize("text", BAD_FILTERS)
async def test_a_bad_filter_is_400_invalid_filter_in_the_query_and_in_search(
    scim: Scim, text: str
) -> None:
    if len(text) < 1000:  # the query's own line bound takes longer ones
        status, answer = await scim.call("GET", "/Users?" + urlencode({"filter": text}))
        assert status == 400 and refused(answer, 400, "invalidFilter")
    for path in ("/Users/.search", "/Groups/.search", "/.search"):
        status, answer = await scim.call("POST", path, _search(text))
        assert status == 400 and refused(answer, 400, "invalidFilter"), path


@pytest.mark.parametrize("filter_", [7, ['userName eq "a"'], {"userName": "a"}, True])
async def test_a_search_s_filter_that_is_not_a_string_is_invalid_filter(
    scim: Scim, filter_: object
) -> None:
    status, answer = await scim.call("POST", "/Users/.search", _search(filter_))
    assert status == 400 and refused(answer, 400, "invalidFilter")


def _nested(levels: int) -> bytes:
    return b'{"schemas": [], "userName": "deep", "x": ' + b"[" * levels + b"]" * levels + b"}"


@pytest.mark.parametrize("levels", [50_000, 1_000, MAX_DEPTH])
@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/Users"), ("PUT", "/Users/{id}"), ("PATCH", "/Users/{id}"),
     ("POST", "/Users/.search"), ("POST", "/Groups"), ("POST", "/.search")],
)  # fmt: skip
async def test_a_body_nested_too_deep_is_400_invalid_syntax(
    scim: Scim, levels: int, method: str, path: str
) -> None:
    _, ann = await scim.call("POST", "/Users", {"userName": "ann"})
    data = _nested(levels)
    status, answer = await raw(scim, method, path.format(id=ann["id"]), data)
    assert status == 400 and refused(answer, 400, "invalidSyntax")
    assert str(MAX_DEPTH) in answer["detail"]
    status, found = await scim.call("GET", '/Users?filter=userName eq "deep"')
    assert found["totalResults"] == 0


@pytest.mark.parametrize(
    "data", [b"", b"{", b"[1]", b'"s"', b"\xff\xfe{}", b'{"a": NaN}', b"{" + b"1" * 5000]
)
async def test_a_body_not_a_json_object_is_400_invalid_syntax(scim: Scim, data: bytes) -> None:
    status, answer = await raw(scim, "POST", "/Users", data)
    assert status == 400 and refused(answer, 400, "invalidSyntax")


async def test_a_900_kb_patch_is_read_whole_and_its_value_refused(scim: Scim) -> None:
    _, ann = await scim.call("POST", "/Users", {"userName": "ann", "name": {"givenName": "Ann"}})
    body = json.dumps(_given_name("g" * 900_000)).encode()
    assert len(body) < MAX_BODY_BYTES
    status, answer = await raw(scim, "PATCH", f"/Users/{ann['id']}", body)
    assert status == 400 and refused(answer, 400, "invalidValue")
    assert "name.givenName" in answer["detail"] and str(MAX_NAME) in answer["detail"]
    assert (await scim.call("GET", f"/Users/{ann['id']}"))[1]["name"] == {"givenName": "Ann"}


@pytest.mark.parametrize("method", ["PATCH", "PUT", "POST"])
async def test_a_body_over_the_limit_is_413_naming_it(scim: Scim, method: str) -> None:
    _, ann = await scim.call("POST", "/Users", {"userName": "ann"})
    body = json.dumps(_given_name("g" * 1_100_000)).encode()
    path = "/Users" if method == "POST" else f"/Users/{ann['id']}"
    status, answer = await raw(scim, method, path, body)
    assert status == 413 and refused(answer, 413, "")
    assert str(MAX_BODY_BYTES) in answer["detail"]


def _over(n: int) -> str:
    return "a" * (n + 1)


@pytest.mark.parametrize(
    ("attrs", "where"),
    [
        ({"name": {"givenName": "g" * 600_000}}, "name.givenName"),
        ({"name": {"familyName": _over(MAX_NAME)}}, "name.familyName"),
        ({"name": {"formatted": 7}}, "name.formatted"),
        ({"name": "Ann"}, "name"),
        ({"displayName": _over(MAX_NAME)}, "displayName"),
        ({"externalId": _over(MAX_EXTERNAL_ID)}, "externalId"),
        ({"emails": [{"value": _over(MAX_EMAIL - 4) + "@x.io"}]}, "emails.value"),
        ({"emails": [{"value": "a@x.io", "type": _over(MAX_NAME)}]}, "emails.type"),
        ({"emails": [{"value": "a@x.io"}] * 11}, "emails"),
        ({"emails": "a@x.io"}, "emails"),
        ({"active": "maybe"}, "active"),
    ],
)
async def test_a_user_attribute_over_its_bound_is_400_invalid_value_and_not_kept(
    scim: Scim, attrs: dict[str, object], where: str
) -> None:
    status, answer = await scim.call("POST", "/Users", {"userName": "ann"} | attrs)
    assert status == 400 and refused(answer, 400, "invalidValue")
    assert answer["detail"].startswith(where + ":") and len(answer["detail"]) < 200
    assert (await scim.call("GET", "/Users"))[1]["totalResults"] == 0
    _, bob = await scim.call("POST", "/Users", {"userName": "bob", "displayName": "Bob"})
    status, answer = await scim.call("PUT", f"/Users/{bob['id']}", {"userName": "bob"} | attrs)
    assert status == 400 and refused(answer, 400, "invalidValue")
    assert (await scim.call("GET", f"/Users/{bob['id']}"))[1]["displayName"] == "Bob"


async def test_a_user_at_every_bound_is_kept(scim: Scim) -> None:
    at = "a" * MAX_NAME
    email = "e" * 64 + "@" + "d" * (MAX_EMAIL - 65)
    body = {"userName": "ann", "displayName": at, "externalId": "x" * MAX_EXTERNAL_ID,
            "name": {"givenName": at, "familyName": at, "formatted": at},
            "emails": [{"value": email, "type": "work", "primary": True}] * 10}  # fmt: skip
    status, ann = await scim.call("POST", "/Users", body)
    assert status == 201, ann
    assert {k: ann[k] for k in body} == body


@pytest.mark.parametrize(
    ("attrs", "where"),
    [
        ({"displayName": _over(MAX_NAME)}, "displayName"),
        ({"displayName": "g", "externalId": _over(MAX_EXTERNAL_ID)}, "externalId"),
        ({"displayName": "g", "members": [{"value": "u" * 600_000}]}, "members.value"),
        ({"displayName": "g", "members": [{"value": "x", "display": _over(MAX_NAME)}]},
         "members.display"),
        ({"displayName": "g", "members": 7}, "members"),
    ],
)  # fmt: skip
async def test_a_group_attribute_over_its_bound_is_400_invalid_value_and_not_kept(
    scim: Scim, attrs: dict[str, object], where: str
) -> None:
    status, answer = await scim.call("POST", "/Groups", attrs)
    assert status == 400 and refused(answer, 400, "invalidValue")
    assert answer["detail"].startswith(where + ":") and len(answer["detail"]) < 200
    assert (await scim.call("GET", "/Groups"))[1]["totalResults"] == 0


@pytest.mark.parametrize(
    ("op", "scim_type"),
    [
        ({"op": "replace", "path": "userName.x", "value": "y"}, "invalidPath"),
        ({"op": "replace", "path": "emails.value", "value": "a@x.io"}, "invalidPath"),
        ({"op": "remove", "path": 'active[value eq "x"]'}, "invalidPath"),
        ({"op": "x" * 600_000}, "invalidSyntax"),
    ],
)
async def test_a_patch_at_a_wrong_target_is_a_400(
    scim: Scim, op: dict[str, object], scim_type: str
) -> None:
    _, ann = await scim.call("POST", "/Users", {"userName": "ann", "emails": [{"value": "a@b.c"}]})
    body = {"schemas": [PATCH_OP], "Operations": [op]}
    status, answer = await scim.call("PATCH", f"/Users/{ann['id']}", body)
    assert status == 400 and refused(answer, 400, scim_type)
    assert len(answer["detail"]) < 200


@pytest.mark.parametrize("schemas", [7, None, "x", {"a": 1}])
async def test_a_body_s_schemas_not_a_list_is_invalid_syntax(scim: Scim, schemas: object) -> None:
    _, ann = await scim.call("POST", "/Users", {"userName": "ann"})
    patch = {"schemas": schemas, "Operations": [{"op": "add", "path": "active", "value": True}]}
    for method, path, body in [("PATCH", f"/Users/{ann['id']}", patch),
                               ("POST", "/Users/.search", {"schemas": schemas})]:  # fmt: skip
        status, answer = await scim.call(method, path, body)
        assert status == 400 and refused(answer, 400, "invalidSyntax"), (method, schemas)


_PIECES = st.sampled_from(
    ["userName", "displayName", "name.givenName", "urn:ietf:params:scim:schemas:core:2.0:User:",
     " ", "eq", "EQ", "sw", "pr", "and", "not", '"', "\\", "\\u", "\\u12", "\\ud800", "\\q",
     '\\"', "\\n", "true", "false", "null", "(", ")", "[", "]", "ann", "\x00", "é", "%", "+"]
)  # fmt: skip
FILTERS = st.one_of(
    st.text(max_size=40),
    st.lists(_PIECES, max_size=12).map("".join),
    st.builds('userName eq "{}"'.format, st.lists(_PIECES, max_size=6).map("".join)),
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(text=FILTERS)
async def test_any_filter_is_answered_or_refused_as_invalid_filter(scim: Scim, text: str) -> None:
    for method, path, body in [("GET", "/Users?" + urlencode({"filter": text}), None),
                               ("POST", "/.search", _search(text))]:  # fmt: skip
        status, answer = await scim.call(method, path, body)
        assert status in (200, 400), (method, text, answer)
        if status == 400:
            assert refused(answer, 400, "invalidFilter"), (method, text, answer)


async def test_a_refusal_is_logged_once_without_the_token(
    scim: Scim, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmgwd.scim")
    long_name = {"userName": "ann", "name": {"givenName": "g" * 600_000}}
    for path, body in [("/Users/.search", _search('userName eq "\\q"')), ("/Users", long_name)]:
        caplog.clear()
        status, _ = await scim.call("POST", path, body)
        logged = [r.getMessage() for r in caplog.records if r.name.startswith("llmgwd.scim")]
        assert status == 400 and len(logged) == 1, logged
        assert scim.secret not in logged[0] and "g" * 300 not in logged[0]


@pytest.mark.parametrize("key", ["attributes", "excludedAttributes", "startIndex", "count"])
async def test_a_search_s_parameter_over_its_bound_is_invalid_value(scim: Scim, key: str) -> None:
    body = {"schemas": [SEARCH], key: ["userName"] * 10_000 if "ttr" in key else 10**1100}
    status, answer = await scim.call("POST", "/Users/.search", body)
    assert status == 400 and refused(answer, 400, "invalidValue")
    assert answer["detail"].startswith(key + ":")
