"""llmgwd as composed: who reads /metrics and /metrics/engines on the client port. A peer on the
loopback needs a credential unless metrics.loopback_open; the scrape token that
POST /api/v1/metrics/token makes reads both and nothing else (not /v1, /api/v1, /hf or
/scim/v2), and a new one stops the old; a staff key (a staff person's own too) reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from llmgw.config import Metrics
from llmgwd.catalog import KeyOwner
from llmgwd.people.directory import Directory
from tests.llmgwd.test_clientport import llmgwd

SCRAPED = ("/metrics", "/metrics/engines")


async def _get(url: str, secret: str = "", method: str = "GET") -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    async with aiohttp.ClientSession() as s, s.request(method, url, headers=headers) as r:
        if r.content_type.startswith("text/plain"):
            return r.status, await r.text()
        return r.status, await r.json(content_type=None)


async def _scrape_token(url: str, admin: str) -> str:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{url}/api/v1/metrics/token", headers={"Authorization": f"Bearer {admin}"}) as r,
    ):
        assert r.status == 201, await r.text()
        made = await r.json()
    assert made["path"] == "/metrics" and made["token"].startswith("metrics-llmgw-")
    return str(made["token"])


async def test_the_loopback_needs_a_credential_unless_the_setting_opens_it(
    tmp_path: Path,
) -> None:
    async with llmgwd(tmp_path / "closed") as port:
        for path in SCRAPED:
            status, body = await _get(port.url + path)  # the test's client is on 127.0.0.1
            assert status == 401, path
            assert body["error"]["code"] == "invalid_api_key"
            assert "llmgw metrics token" in body["error"]["message"]
    async with llmgwd(tmp_path / "open", Metrics(loopback_open=True)) as port:
        status, text = await _get(port.url + "/metrics")
        assert status == 200 and "llmgw_nodes" in text
        assert (await _get(port.url + "/metrics/engines"))[0] == 200


async def test_the_scrape_token_reads_both_and_nothing_else(tmp_path: Path) -> None:
    async with llmgwd(tmp_path) as port:
        _, admin = await port.daemon.catalog.create_key("ops", "admin")
        scrape = await _scrape_token(port.url, admin)
        status, text = await _get(port.url + "/metrics", scrape)
        assert status == 200 and "llmgw_nodes" in text
        assert (await _get(port.url + "/metrics/engines", scrape))[0] == 200
        for method, path in [("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                             ("GET", "/api/v1/status"), ("GET", "/api/v1/keys"),
                             ("POST", "/api/v1/metrics/token"), ("GET", "/scim/v2/Users"),
                             ("GET", "/hf/api/models/a/b")]:  # fmt: skip
            status, body = await _get(port.url + path, scrape, method)
            assert status == 401, (method, path, status)
            assert scrape not in str(body)


async def test_a_new_scrape_token_stops_the_old_one(tmp_path: Path) -> None:
    async with llmgwd(tmp_path) as port:
        _, admin = await port.daemon.catalog.create_key("ops", "admin")
        old = await _scrape_token(port.url, admin)
        new = await _scrape_token(port.url, admin)
        for path in SCRAPED:
            status, body = await _get(port.url + path, old)
            assert status == 401 and old not in str(body)
            assert (await _get(port.url + path, new))[0] == 200


async def test_staff_keys_read_the_metrics_and_other_keys_do_not(tmp_path: Path) -> None:
    async with llmgwd(tmp_path) as port:
        d = port.daemon
        people = Directory(d.store)
        viewer, member = await people.create_user("vee"), await people.create_user("ann")
        await people.set_staff(viewer.id, "viewer")
        _, admin = await d.catalog.create_key("ops", "admin")
        _, staff = await d.catalog.create_key("vee", owner=KeyOwner(user=viewer.id))
        _, user = await d.catalog.create_key("ann", owner=KeyOwner(user=member.id))
        _, plain = await d.catalog.create_key("app", "user")
        for path in SCRAPED:
            assert (await _get(port.url + path, admin))[0] == 200, path
            assert (await _get(port.url + path, staff))[0] == 200, path  # a viewer's own key
            for secret in (user, plain):
                status, body = await _get(port.url + path, secret)
                assert status == 403 and body["error"]["type"] == "permission_error"
            status, _ = await _get(port.url + path, "sk-llmgw-not-a-key")
            assert status == 401


async def test_status_carries_this_plane_s_own_requests_and_errors(tmp_path: Path) -> None:
    async with llmgwd(tmp_path) as port:
        _, admin = await port.daemon.catalog.create_key("ops", "admin")
        assert (await _get(port.url + "/v1/models", "not-a-key"))[0] == 401
        status, answer = await _get(port.url + "/api/v1/status", admin)
        traffic = answer["traffic"]
        assert status == 200 and traffic["scope"] == "this control plane"
        assert traffic["window_s"] > 0 and traffic["errors_4xx_per_s"] > 0
        assert traffic["requests_per_s"] == traffic["errors_4xx_per_s"]  # the 401 alone
        assert traffic["errors_5xx_per_s"] == 0
