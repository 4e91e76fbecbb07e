"""/api/v1/openapi.json: made from the route table, every route in it, every type it names
described, and answers that decode into the shared types (llmgw.api_types) the CLI uses."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.api_types import ErrorAnswer, TokenView
from llmgw.cli.common import error_message
from llmgwd.api import openapi, routes
from llmgwd.api.access import key_auth
from llmgwd.api.base import ApiContext, NodeInfo
from llmgwd.api.routes import api_subapp
from llmgwd.catalog import Catalog
from llmgwd.store.sqlite import SqliteStore


class NoNodes:
    def nodes(self) -> list[NodeInfo]:
        return []


@pytest.fixture
async def api() -> AsyncIterator[tuple[aiohttp.ClientSession, dict[str, str]]]:
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    ctx = ApiContext(
        catalog=catalog, nodes=NoNodes(), mint_token=lambda: "t", join_url="https://cp:7710"
    )
    app = web.Application()
    app.add_subapp("/api/v1", api_subapp(ctx, key_auth(catalog)))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    _, admin = await catalog.create_key("a", "admin")
    async with aiohttp.ClientSession(str(server.make_url(""))) as s:
        yield s, {"Authorization": f"Bearer {admin}"}
    await server.close()
    await store.close()


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


async def test_the_document_is_served_and_holds_every_route(
    api: tuple[aiohttp.ClientSession, dict[str, str]],
) -> None:
    session, auth = api
    async with session.get("/api/v1/openapi.json") as resp:
        assert resp.status == 401  # a key is needed, as on every route
    async with session.get("/api/v1/openapi.json", headers=auth) as resp:
        assert resp.status == 200
        doc = await resp.json()
    assert doc["openapi"].startswith("3.1")
    served = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    table = {(r.method, "/api/v1" + openapi.plain_path(r.path)) for r in routes.TABLE}
    assert served == table and len(table) >= 50
    names = {"#/components/schemas/" + n for n in doc["components"]["schemas"]}
    assert _refs(doc["paths"]) - {"#/components/responses/Error"} <= names
    assert _refs(doc["components"]) <= names
    error = doc["components"]["responses"]["Error"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/ErrorAnswer"}
    tokens = doc["paths"]["/api/v1/tokens"]["post"]
    assert tokens["x-staff-roles"] == ["admin", "operator"]
    assert tokens["responses"]["403"] == {"$ref": "#/components/responses/Error"}
    json.dumps(doc)  # plain JSON


async def test_answers_decode_into_the_shared_types(
    api: tuple[aiohttp.ClientSession, dict[str, str]],
) -> None:
    session, auth = api
    async with session.post("/api/v1/tokens", headers=auth) as resp:
        token = msgspec.convert(await resp.json(), TokenView)
    assert token.command.startswith("llmgw node join https://cp:7710 --token ")
    async with session.get("/api/v1/models/nope", headers=auth) as resp:
        answer = await resp.json()
    err = msgspec.convert(answer, ErrorAnswer)
    assert resp.status == 404 and err.error.code == "model_not_found"
    assert error_message(answer, 404) == "no model 'nope'"
    assert error_message({"detail": "?"}, 502) == "the daemon answered HTTP 502"


async def test_an_undeclared_method_is_a_405_naming_the_allowed_ones(
    api: tuple[aiohttp.ClientSession, dict[str, str]],
) -> None:
    session, auth = api
    async with session.request("TRACE", "/api/v1/tokens", headers=auth) as resp:
        answer = msgspec.convert(await resp.json(), ErrorAnswer)
        assert resp.status == 405 and answer.error.code == "method_not_allowed"
        assert resp.headers["Allow"] == "POST"  # RFC 9110 asks for it; schemathesis found it


async def test_created_routes_are_documented_as_201_and_empty_bodies_as_optional(
    api: tuple[aiohttp.ClientSession, dict[str, str]],
) -> None:
    session, auth = api
    async with session.get("/api/v1/openapi.json", headers=auth) as resp:
        paths = (await resp.json())["paths"]
    async with session.post("/api/v1/tokens", headers=auth) as resp:
        assert resp.status == 201 and "201" in paths["/api/v1/tokens"]["post"]["responses"]
    assert paths["/api/v1/mirror/sweep"]["post"]["requestBody"]["required"] is False
    assert paths["/api/v1/keys"]["post"]["requestBody"]["required"] is True


@pytest.mark.parametrize("literal", ["tokens", "leave"])
@pytest.mark.parametrize("planes", ["planes", "servers"])  # and the old word, deprecated
async def test_delete_planes_name_is_not_planes_tokens_or_leave(
    api: tuple[aiohttp.ClientSession, dict[str, str]], literal: str, planes: str
) -> None:
    # /planes/tokens and /planes/leave are POST only: DELETE there is a 405 that says so,
    # not a removal of a control plane named "tokens" (no control plane may be so named).
    session, auth = api
    async with session.delete(f"/api/v1/{planes}/{literal}", headers=auth) as resp:
        assert resp.status == 405
        assert resp.headers["Allow"] == "POST"
        msgspec.json.decode(await resp.read(), type=ErrorAnswer)
    async with session.delete(f"/api/v1/{planes}/cp-2", headers=auth) as resp:
        assert resp.status == 503  # the route is there (this llmgwd keeps no control planes)


async def test_the_old_servers_paths_are_the_planes_ones_deprecated(
    api: tuple[aiohttp.ClientSession, dict[str, str]],
) -> None:
    session, auth = api
    async with session.get("/api/v1/openapi.json", headers=auth) as resp:
        paths = (await resp.json())["paths"]
    old = {p: ops for p, ops in paths.items() if p.startswith("/api/v1/servers")}
    assert len(old) == 4  # /servers, /servers/tokens, /servers/leave, /servers/{name}
    for path, ops in old.items():
        new = paths[path.replace("/api/v1/servers", "/api/v1/planes", 1)]
        assert set(ops) == set(new)
        for method, op in ops.items():
            assert op.pop("deprecated") is True
            assert op | {"operationId": ""} == new[method] | {"operationId": ""}
    for path, ops in paths.items():
        assert path in old or not any("deprecated" in op for op in ops.values()), path


async def test_the_request_schemas_say_what_the_handlers_check(
    api: tuple[aiohttp.ClientSession, dict[str, str]],
) -> None:
    session, auth = api
    async with session.get("/api/v1/openapi.json", headers=auth) as resp:
        schemas = (await resp.json())["components"]["schemas"]
    name = schemas["ModelIn"]["properties"]["name"]
    assert name["pattern"] == "^[a-z0-9][a-z0-9._-]{0,63}$"
    assert schemas["ModelIn"]["properties"]["engine"]["enum"] == ["freetoken", "llama.cpp", "vllm"]
    assert schemas["ServeIn"]["properties"]["replicas"] == {
        "type": "integer", "minimum": 0, "maximum": 1024
    }  # fmt: skip
    assert schemas["UserIn"]["properties"]["name"]["pattern"] == name["pattern"]
    assert "pattern" in schemas["UserIn"]["properties"]["email"]
    assert schemas["NamedIn"]["properties"]["title"]["maxLength"] == 200
    prompt = schemas["PriceIn"]["properties"]["prompt"]
    assert (prompt["minimum"], prompt["maximum"]) == (0, 1e9)
    source = schemas["ModelIn"]["properties"]["source"]["pattern"]
    assert re.search(source, "file:/srv/m.gguf") and re.search(source, "hf:org/m")
    assert not re.search(source, "file:m.gguf") and not re.search(source, "/m.gguf")
    # A body that breaks one is refused as before: a 400 naming the field.
    for path, body, field in [
        ("/api/v1/models", {"name": "Bad Name", "source": "/m.gguf", "engine": "vllm"}, "name"),
        ("/api/v1/users", {"name": "u", "email": "not an email"}, "email"),
        ("/api/v1/orgs", {"name": "-org"}, "name"),
    ]:
        async with session.post(path, json=body, headers=auth) as resp:
            assert resp.status == 400
            error = msgspec.json.decode(await resp.read(), type=ErrorAnswer).error
            assert error.param == field
            assert "must" in error.message and "regex" not in error.message  # said plainly


def test_the_mirror_requests_say_their_repository_file_and_peer_checks() -> None:
    from llmgw.api_types import ImportFile, ImportIn, PeerIn

    for bad in (b'{"repo": "a--b/c", "files": []}', b'{"repo": "", "files": []}'):
        with pytest.raises(msgspec.ValidationError, match="repo"):
            msgspec.json.decode(bad, type=ImportIn)
    with pytest.raises(msgspec.ValidationError, match="files"):
        msgspec.json.decode(b'{"repo": "org/model-7b", "files": []}', type=ImportIn)
    one = {"path": "m.gguf", "size": 1, "sha256": "0" * 64}
    msgspec.convert({"repo": "org/model-7b", "files": [one]}, ImportIn)
    with pytest.raises(msgspec.ValidationError, match="sha256"):
        msgspec.convert({"path": "a", "size": 1, "sha256": "0"}, ImportFile)
    with pytest.raises(msgspec.ValidationError, match="url"):
        msgspec.convert({"url": "ftp://x/hf"}, PeerIn)
    (_,), components = openapi.msgspec_schemas([ImportIn])
    assert "pattern" in components["ImportIn"]["properties"]["repo"]


async def test_a_model_answer_is_the_shared_type(
    api: tuple[aiohttp.ClientSession, dict[str, str]],
) -> None:
    from llmgw.api_types import ModelView
    from llmgwd.api import models

    assert models.ModelView is ModelView  # one definition, in llmgw.api_types
    session, auth = api
    body = {"name": "m", "source": "file:/srv/m.gguf", "engine": "llama.cpp"}
    async with session.post("/api/v1/models", json=body, headers=auth) as resp:
        assert resp.status == 201
        added = msgspec.json.decode(await resp.read(), type=ModelView)
    async with session.get("/api/v1/models", headers=auth) as resp:
        assert msgspec.json.decode(await resp.read(), type=list[ModelView]) == [added]


async def test_keys_and_path_parameters_say_what_the_handlers_check(
    api: tuple[aiohttp.ClientSession, dict[str, str]],
) -> None:
    session, auth = api
    async with session.get("/api/v1/openapi.json", headers=auth) as resp:
        doc = await resp.json()
    key_in = doc["components"]["schemas"]["KeyIn"]["properties"]
    assert sorted(key_in["role"]["enum"]) == ["admin", "user"] and "pattern" in key_in["name"]
    (node,) = doc["paths"]["/api/v1/nodes/{name}"]["delete"]["parameters"]
    assert node["schema"]["pattern"].startswith("^[A-Za-z0-9]")
    flags = doc["paths"]["/api/v1/nodes/{name}/{action}"]["post"]["parameters"]
    assert flags[1]["schema"]["enum"] == ["cordon", "drain", "uncordon"]
    (sha,) = doc["paths"]["/api/v1/mirror/uploads/{sha256}"]["put"]["parameters"]
    assert sha["schema"]["pattern"] == "^[0-9a-f]{64}$"
    for name in ("0123456789ab", "a\u0001b", " "):
        async with session.post("/api/v1/keys", json={"name": name}, headers=auth) as resp:
            assert resp.status == 400
            error = msgspec.json.decode(await resp.read(), type=ErrorAnswer).error
            assert error.param == "name"


async def test_a_persons_key_name_says_what_its_handler_checks(
    api: tuple[aiohttp.ClientSession, dict[str, str]],
) -> None:
    session, auth = api
    async with session.get("/api/v1/openapi.json", headers=auth) as resp:
        schemas = (await resp.json())["components"]["schemas"]
    name = schemas["PersonKeyIn"]["properties"]["name"]
    assert name["pattern"] == schemas["KeyIn"]["properties"]["name"]["pattern"]
    assert "printable" in name["description"]
    for good in ("laptop", "My laptop", "ci/nightly", "x" * 64):
        assert re.search(name["pattern"], good), good
    for bad in ("", " ", "0123456789ab", "a\u0001b", "x" * 65):
        assert not re.search(name["pattern"], bad), bad


async def test_a_key_answer_is_the_shared_type(
    api: tuple[aiohttp.ClientSession, dict[str, str]],
) -> None:
    from llmgw.api_types import KeyView, NewKey
    from llmgwd import catalog
    from llmgwd.api import keys

    assert (keys.KeyView, keys.NewKey) == (KeyView, NewKey)  # one definition, in llmgw.api_types
    assert catalog.KeyLimits is msgspec.structs.fields(KeyView)[-1].type
    session, auth = api
    async with session.post("/api/v1/keys", json={"name": "ci"}, headers=auth) as resp:
        new = msgspec.json.decode(await resp.read(), type=NewKey)
    async with session.get("/api/v1/keys", headers=auth) as resp:
        listed = msgspec.json.decode(await resp.read(), type=list[KeyView])
    assert new.id in {k.id for k in listed}


@pytest.mark.parametrize("url", ["http://\u0011]/hf", "http://[::1/hf", "http://h:99999/hf"])
def test_a_peer_url_that_urlsplit_cannot_read_is_refused(url: str) -> None:
    # Was a 500 (urlsplit's ValueError), found by schemathesis once PeerIn stated its pattern.
    from llmgwd.mirror import peers

    with pytest.raises(peers.PeerError, match="is not an http"):
        peers.check_url(url)
