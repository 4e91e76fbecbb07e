"""PyPI's scim2-tester (RFC 7643/7644 checks written by others) against llmgwd's /scim/v2,
served in-process: discovery, every method on each endpoint, users' and groups' create, read,
replace, PATCH add/replace/remove of each attribute, queries with attributes, delete, and a
404 in SCIM's error shape; every check it makes passes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx2
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from scim2_client.engines.httpx2 import SyncSCIMClient
from scim2_tester import CheckResult, Status, check_server

from llmgw.config import GroupRule
from llmgwd.catalog import Catalog
from llmgwd.people.directory import Directory
from llmgwd.scim import token
from llmgwd.scim.app import PREFIX, scim_app
from llmgwd.scim.base import ScimContext
from llmgwd.store.sqlite import SqliteStore


def _checks(url: str, secret: str) -> list[CheckResult]:
    with httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {secret}"}) as http:
        return check_server(SyncSCIMClient(http))


@pytest.fixture
async def scim_url() -> AsyncIterator[tuple[str, str]]:
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    await Directory(store).create_org("acme")
    rules = (GroupRule(group="staff", org="acme", role="member"),)
    app = web.Application()
    app.add_subapp(PREFIX, scim_app(ScimContext(catalog, rules)))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url(PREFIX)), await token.mint(store)
    await server.close()
    await store.close()


async def test_scim2_tester_s_checks_all_pass(scim_url: tuple[str, str]) -> None:
    results = await asyncio.to_thread(_checks, *scim_url)
    failed = [f"{r.title} {r.resource_type}: {r.reason}" for r in results
              if r.status != Status.SUCCESS]  # fmt: skip
    assert len(results) >= 60
    assert failed == []


async def test_scim2_tester_with_a_wrong_token_gets_nowhere(scim_url: tuple[str, str]) -> None:
    url, _ = scim_url
    results = await asyncio.to_thread(_checks, url, "scim-llmgw-wrong")
    assert not any(r.status == Status.SUCCESS and r.resource_type for r in results)
