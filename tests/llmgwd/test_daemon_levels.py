"""llmgwd as composed: an organization's list of models set through /api/v1 reaches /v1 (the
catalog's watch keeps the levels the router's Meter reads)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from llmgwd.catalog import KeyOwner, Model
from tests.llmgwd.test_clientport import llmgwd
from tests.llmgwd.test_daemon_people import _call


async def test_an_organizations_models_set_on_the_api_hold_on_v1(tmp_path: Path) -> None:
    async with llmgwd(tmp_path) as port:
        d = port.daemon
        admin = (await d.catalog.create_key("ops", "admin"))[1]
        for body in ({"name": "acme"}, {"name": "globex"}):
            assert (await _call(port.url + "/api/v1/orgs", "POST", admin, body))[0] == 201
        path = "/api/v1/orgs/acme/projects"
        assert (await _call(port.url + path, "POST", admin, {"name": "chat"}))[0] == 201
        assert (await _call(port.url + "/api/v1/users", "POST", admin, {"name": "ann"}))[0] == 201
        _, ann = await _call(port.url + "/api/v1/users/ann", "GET", admin)
        owner = KeyOwner(user=ann["id"], org="acme", project="chat")
        _, key = await d.catalog.create_key("ann", owner=owner)
        for name in ("small", "big"):
            await d.catalog.add_model(Model(name=name, source=f"file:/{name}.gguf"))
        limits: dict[str, object] = {"models": ["small"], "rpm": 100}
        status, _ = await _call(port.url + "/api/v1/orgs/acme/limits", "PATCH", admin, limits)
        assert status == 200
        for _ in range(200):  # the watch brings it (at once, give or take a task switch)
            _, listed = await _call(port.url + "/v1/models", "GET", key)
            if [m["id"] for m in listed["data"]] == ["small"]:
                break
            await asyncio.sleep(0.01)
        assert [m["id"] for m in listed["data"]] == ["small"]
        status, body = await _call(port.url + "/v1/models/big", "GET", key)
        assert status == 404 and body["error"]["code"] == "model_not_found"
        _, listed = await _call(port.url + "/v1/models", "GET", admin)  # no organization
        assert sorted(m["id"] for m in listed["data"]) == ["big", "small"]
