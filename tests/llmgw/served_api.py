"""llmgwd's admin API on a Unix socket, served from a loop on a background thread, for the
CLI's tests: the real app over a real socket, a SQLite store in memory."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from aiohttp import web
from click.testing import CliRunner, Result

from llmgw.cli.main import main
from llmgwd.api.access import peercred_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw.test_cli import _start_site


@contextmanager
def served_api(
    socket: str, context: Callable[[SqliteStore], Awaitable[ApiContext]]
) -> Iterator[Callable[..., Result]]:
    """Serve the API that context(store) makes on socket; yields `llmgw --socket SOCKET ...`."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[SqliteStore, web.AppRunner]:
        store = await SqliteStore.open(":memory:")
        app = api_app(await context(store), peercred_auth("llmgw"))
        return store, await _start_site(app, socket)

    store, runner = asyncio.run_coroutine_threadsafe(start(), loop).result(10)

    def run(*args: str) -> Result:
        return CliRunner().invoke(main, ["--socket", socket, *args])

    try:
        yield run
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        asyncio.run_coroutine_threadsafe(store.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
