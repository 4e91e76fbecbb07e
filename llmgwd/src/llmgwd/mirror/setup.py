"""The mirror put together for llmgwd: its settings, its start, and /hf on the client port."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from aiohttp import web

from llmgw import sources
from llmgw.config import ServerConfig
from llmgw.wire import HeldFile, ModelFile, Sweep
from llmgwd.catalog import Catalog, CatalogError
from llmgwd.cluster import ClusterState
from llmgwd.mirror import hub_auth, hub_server, peers
from llmgwd.mirror.records import Records
from llmgwd.mirror.service import Mirror, Settings
from llmgwd.mirror.shapes import shape_of_set
from llmgwd.store import Store

log = logging.getLogger(__name__)


def settings(cfg: ServerConfig, state_dir: Path) -> Settings:
    """server.yaml's mirror section, with its directory resolved."""
    m = cfg.mirror
    return Settings(
        dir=Path(m.dir) if m.dir else state_dir / "mirror",
        upstream=m.upstream,
        token_file=m.token_file,
        parallel=m.parallel,
    )


async def start(cfg: ServerConfig, state_dir: Path, store: Store, catalog: Catalog) -> Mirror:
    """Open the mirror, read each set's shape when it is whole, and carry on fetching the
    sets of the catalog's models that a stop cut short."""
    mirror = Mirror(settings(cfg, state_dir), Records(store))
    await mirror.start()
    follow_catalog(mirror, catalog)
    for model in catalog.all():
        if sources.is_hf(model.source) and model.files:
            mirror.fetch(model.source, list(model.files))
    task = asyncio.get_running_loop().create_task(peers.run(mirror))
    _pending.add(task)
    return mirror


def follow_catalog(mirror: Mirror, catalog: Catalog) -> None:
    """The catalog's models keep their files in the mirror, and get their shape from it."""

    def fetched(source: str, files: list[ModelFile]) -> None:
        task = asyncio.get_running_loop().create_task(_shapes(mirror, catalog, source, files))
        _pending.add(task)
        task.add_done_callback(_pending.discard)

    mirror.on_done(fetched)
    mirror.models_use = lambda: {f.sha256 for m in catalog.all() for f in m.files if f.sha256}


_pending: set[asyncio.Task[None]] = set()


async def _shapes(mirror: Mirror, catalog: Catalog, source: str, files: list[ModelFile]) -> None:
    """Give every model of this source the shape read from the mirror's copy."""
    shape, why = await asyncio.to_thread(shape_of_set, mirror.store, files)
    for model in catalog.all():
        if model.source != source:
            continue
        if why:
            log.warning("model %s: %s", model.name, why)
        try:
            await catalog.update_model(model.name, shape=shape, shape_error=why)
        except CatalogError:
            continue  # removed meanwhile


class NodeFilesOf:
    """The nodes' caches as sweeps see them, from the cluster port's state."""

    def __init__(self, cluster: ClusterState) -> None:
        self._cluster = cluster

    def connected(self) -> list[str]:
        """Nodes linked now."""
        return self._cluster.connected()

    def held(self, node: str) -> list[HeldFile] | None:
        """What a node last listed."""
        return self._cluster.holdings.of(node)

    def send_sweep(self, node: str, msg: Sweep) -> bool:
        """Ask a node to delete files."""
        return self._cluster.send_sweep(node, msg)

    async def swept(self, node: str, sweep_id: str, timeout: float) -> list[HeldFile] | None:  # noqa: ASYNC109
        """A node's list in answer to a sweep."""
        return await self._cluster.holdings.swept(node, sweep_id, timeout)


def hub(mirror: Mirror, catalog: Catalog) -> web.Application:
    """/hf: the hub's protocol over the mirror, for any live llmgw key, and the listing of
    its whole sets that its peers copy from."""
    app: web.Application = hub_server.hub_app(mirror, hub_auth.key_auth(catalog))
    app.router.add_get(peers.LISTING, peers.listing_handler(mirror))
    return app
