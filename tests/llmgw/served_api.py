"""llmgwd's admin API on a Unix socket (or over HTTPS, guarded by keys, through a context
with an admin key and the CA pinned), served from a loop on a background thread, for the
CLI's tests: the real app over a real socket, a SQLite store in memory."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from aiohttp import web
from click.testing import CliRunner, Result

from llmgw.cli.main import main
from llmgwd.api.access import key_auth, peercred_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw.https_site import ADMIN_SECRET, WithAdmin, add_context, make_tls, start_tls_site
from tests.llmgw.test_cli import _start_site


@contextmanager
def served_api(
    socket: str,
    context: Callable[[SqliteStore], Awaitable[ApiContext]],
    transport: str = "socket",
) -> Iterator[Callable[..., Result]]:
    """Serve the API that context(store) makes on socket (or, transport "https", over TLS on
    127.0.0.1, the commands' context in a config dir beside socket); yields
    `llmgw --socket SOCKET ...`."""
    tmp = Path(socket).parent
    env = {"XDG_CONFIG_HOME": str(tmp / "config")}
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    tls = make_tls(tmp) if transport == "https" else None

    async def start() -> tuple[SqliteStore, web.AppRunner, str]:
        store = await SqliteStore.open(":memory:")
        ctx = await context(store)
        if tls is None:
            return store, await _start_site(api_app(ctx, peercred_auth("llmgw")), socket), ""
        app = api_app(ctx, key_auth(WithAdmin(ctx.catalog)))
        return store, *await start_tls_site(app, tls.server)

    store, runner, url = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    if tls is not None:
        (tmp / "admin.key").write_text(ADMIN_SECRET)
        add_context(tmp / "config", "test", url, "--ca-fingerprint", tls.fingerprint,
                    "--key-file", str(tmp / "admin.key"))  # fmt: skip
        env["LLMGW_CONTEXT"] = "test"

    def run(*args: str) -> Result:
        return CliRunner().invoke(main, ["--socket", socket, *args], env=env)

    try:
        yield run
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        asyncio.run_coroutine_threadsafe(store.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
