"""`llmgw org ...` and `llmgw user ...` against a real admin API on a Unix socket (its caller
is a staff admin)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from llmgw.cli.main import main
from llmgwd.api.access import peercred_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw.test_cli import JOIN_URL, FakeNodes, _start_site


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Callable[..., Result]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    socket = str(tmp_path / "d.sock")

    async def start() -> tuple[SqliteStore, web.AppRunner]:
        store = await SqliteStore.open(":memory:")
        ctx = ApiContext(
            catalog=Catalog(store), nodes=FakeNodes(), mint_token=lambda: "t", join_url=JOIN_URL
        )
        return store, await _start_site(api_app(ctx, peercred_auth("llmgw")), socket)

    store, runner = asyncio.run_coroutine_threadsafe(start(), loop).result(10)

    def run(*args: str) -> Result:
        return CliRunner().invoke(main, ["--socket", socket, *args])

    yield run
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    asyncio.run_coroutine_threadsafe(store.close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def _ok(r: Result) -> str:
    assert r.exit_code == 0, r.output
    return r.stdout


def test_an_organization_made_and_shown(cli: Callable[..., Result]) -> None:
    assert "Organization acme made." in _ok(cli("org", "create", "acme", "--title", "ACME"))
    _ok(cli("org", "team", "acme", "ml"))
    _ok(cli("org", "project", "acme", "chat", "--team", "ml"))
    assert "User ann made" in _ok(cli("user", "create", "ann", "--email", "ann@acme.org"))
    assert "ann is manager of team ml." in _ok(cli("org", "member", "acme", "ann", "manager",
                                                   "--team", "ml"))  # fmt: skip
    shown = _ok(cli("org", "show", "acme"))
    assert "ml" in shown and "chat" in shown and "manager" in shown
    assert [o["name"] for o in json.loads(_ok(cli("org", "list", "--json")))] == ["acme"]
    _ok(cli("user", "staff", "ann", "viewer"))
    assert "ann" in _ok(cli("user", "list"))


def test_refusals_end_the_command_with_the_reason(cli: Callable[..., Result]) -> None:
    _ok(cli("org", "create", "acme"))
    r = cli("org", "create", "acme")
    assert r.exit_code != 0 and "exists" in r.output
    r = cli("org", "member", "acme", "nobody", "member")
    assert r.exit_code != 0 and "nobody" in r.output
    r = cli("org", "member", "acme", "ann", "member", "--team", "a", "--project", "b")
    assert r.exit_code == 2
