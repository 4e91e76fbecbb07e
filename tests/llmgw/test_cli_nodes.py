"""`llmgw node remove` against a real admin API on a Unix socket."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
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


class Api:
    """llmgwd's API served from a loop on a background thread; which nodes it removed."""

    def __init__(self, socket: str) -> None:
        self.socket = socket
        self.removed: list[str] = []

    async def remove_node(self, name: str) -> bool:
        self.removed.append(name)
        return name == "gpu1"  # the only node known here

    def cli(self, *args: str) -> Result:
        return CliRunner().invoke(main, ["--socket", self.socket, *args])


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    a = Api(str(tmp_path / "d.sock"))

    async def start() -> tuple[SqliteStore, web.AppRunner]:
        store = await SqliteStore.open(":memory:")
        ctx = ApiContext(
            catalog=Catalog(store),
            nodes=FakeNodes(),
            mint_token=lambda: "tok-1",
            join_url=JOIN_URL,
            remove_node=a.remove_node,
        )
        return store, await _start_site(api_app(ctx, peercred_auth("llmgw")), a.socket)

    store, runner = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    yield a
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    asyncio.run_coroutine_threadsafe(store.close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_node_remove(api: Api) -> None:
    r = api.cli("node", "remove", "gpu1", "--yes")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "Node gpu1 removed: its certificates are refused from now on."
    assert (
        json.loads(api.cli("node", "remove", "gpu1", "--json", "--yes").stdout)["removed"] is True
    )
    r = api.cli("node", "remove", "nope", "--yes")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("No node nope is known here; its name is revoked all the same")
    assert api.removed == ["gpu1", "gpu1", "nope"]
