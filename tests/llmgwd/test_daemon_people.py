"""llmgwd as composed: /scim/v2 served on the client port with its own token, and a user that
SCIM deactivates has their key refused at once on /v1 (OpenAI's shape) and /api/v1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from llmgwd.catalog import KeyOwner
from llmgwd.scim import token
from llmgwd.scim.base import PATCH_OP
from tests.llmgwd.test_clientport import llmgwd


async def _call(url: str, method: str, secret: str, body: object = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {secret}"}
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, url, headers=headers, json=body) as r,
    ):
        return r.status, await r.json(content_type=None)


async def test_scim_deactivation_stops_the_user_s_key_on_v1_and_api(tmp_path: Path) -> None:
    async with llmgwd(tmp_path) as port:
        d = port.daemon
        scim = await token.mint(d.store)
        status, ann = await _call(port.url + "/scim/v2/Users", "POST", scim, {"userName": "ann"})
        assert status == 201
        _, key = await d.catalog.create_key("laptop", owner=KeyOwner(user=ann["id"]))
        assert (await _call(port.url + "/v1/models", "GET", key))[0] == 200
        assert (await _call(port.url + "/api/v1/me/keys", "GET", key))[0] == 200
        assert (await _call(port.url + "/scim/v2/Users", "GET", key))[0] == 401  # no SCIM token
        off = {"schemas": [PATCH_OP], "Operations": [{"op": "replace", "path": "active",
                                                      "value": False}]}  # fmt: skip
        url = f"{port.url}/scim/v2/Users/{ann['id']}"
        assert (await _call(url, "PATCH", scim, off))[0] == 200
        status, body = await _call(port.url + "/v1/models", "GET", key)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        assert (await _call(port.url + "/api/v1/me/keys", "GET", key))[0] == 401
