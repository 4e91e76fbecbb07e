"""llmgwd's /api/v1 served in-process for schemathesis (a SQLite store and the mirror in a
temporary directory, an admin key), on 127.0.0.1 in a thread of its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd.api.access import key_auth
from llmgwd.api.base import ApiContext, NodeInfo
from llmgwd.api.routes import api_subapp
from llmgwd.catalog import Catalog, Model
from llmgwd.mirror.records import Records
from llmgwd.mirror.service import Mirror, Settings
from llmgwd.placement.profiles import Profile
from llmgwd.placement.reconciler import Failure, NodeFlags
from llmgwd.placement.scheduler import Placement, Verdict
from llmgwd.providers.credentials import Credentials
from llmgwd.slurm.settings import SettingsStore
from llmgwd.store.sqlite import SqliteStore


class NoScheduling:
    """A reconciler that places nothing: no node, no failure, no plan."""

    def __init__(self) -> None:
        self._flags: dict[str, NodeFlags] = {}

    def awake(self, model: Model) -> bool:
        return True

    def flags(self, node: str) -> NodeFlags:
        return self._flags.get(node, NodeFlags())

    async def set_flags(self, node: str, flags: NodeFlags) -> None:
        self._flags[node] = flags

    def placements(self) -> list[Placement]:
        return []

    def failures(self) -> list[Failure]:
        return []

    def explain(self, model: Model) -> list[tuple[Profile, list[Verdict]]]:
        return []

    def rollout(self, model: Model) -> str:
        return ""


async def _no_node(name: str) -> bool:
    return False


class NoNodes:
    """A cluster with no node."""

    def nodes(self) -> list[NodeInfo]:
        return []


@dataclass(frozen=True)
class Served:
    """Where the API answers, and an admin key for it."""

    url: str  # http://127.0.0.1:PORT
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


async def _start(
    state: Path, stop: asyncio.Event, ready: asyncio.Future[Served] | None = None
) -> Served:
    store = await SqliteStore.open(str(state / "store.db"))
    catalog = Catalog(store)
    await catalog.load()
    mirror = Mirror(Settings(dir=state / "mirror", upstream="http://127.0.0.1:9"), Records(store))
    await mirror.start()
    ctx = ApiContext(
        catalog=catalog,
        nodes=NoNodes(),
        mint_token=lambda: "t",
        join_url="https://cp:7710",
        mirror=mirror,
        scheduling=NoScheduling(),
        remove_node=_no_node,
        slurm=SettingsStore(store),
        slurm_status=lambda: [],
        credentials=Credentials(b"fuzz-cluster-secret"),  # providers' credentials sealed
    )
    app = web.Application()
    app.add_subapp("/api/v1", api_subapp(ctx, key_auth(catalog)))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    _, admin = await catalog.create_key("fuzz", "admin")
    served = Served(str(server.make_url("")).rstrip("/"), admin)
    if ready is not None:
        ready.set_result(served)
    await stop.wait()
    await server.close()
    await mirror.close()
    await store.close()
    return served


@contextmanager
def serving(state: Path) -> Iterator[Served]:
    """The API served from a thread until the block ends; its state under state."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ready: asyncio.Future[Served] = loop.create_future()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(_start(state, stop, ready),), daemon=True
    )
    thread.start()
    served = asyncio.run_coroutine_threadsafe(_wait(ready), loop).result(timeout=30)
    try:
        yield served
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()


async def _wait(ready: asyncio.Future[Served]) -> Served:
    return await ready
