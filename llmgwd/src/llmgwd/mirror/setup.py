"""The mirror put together for llmgwd: its settings, its start, and /hf on the client port."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from llmgw import pki, sources
from llmgw.config import ServerConfig
from llmgw.wire import HeldFile, ModelFile, Sweep
from llmgwd import auth
from llmgwd.catalog import ApiKey, Catalog, CatalogError
from llmgwd.mirror import fleet, hub_auth, hub_server, peers
from llmgwd.mirror.disk_check import DiskCheck
from llmgwd.mirror.holders import Holders
from llmgwd.mirror.records import Records
from llmgwd.mirror.service import Mirror, Settings
from llmgwd.nodes.state import ClusterState
from llmgwd.people.directory import Directory
from llmgwd.placement.model_shape import shape_of_set
from llmgwd.store import Store, StoreUnavailable

log = logging.getLogger(__name__)


def settings(cfg: ServerConfig, state_dir: Path) -> Settings:
    """server.yaml's mirror section, with its directory resolved."""
    m = cfg.mirror
    return Settings(
        dir=Path(m.dir) if m.dir else state_dir / "mirror",
        upstream=m.upstream,
        token_file=m.token_file,
        parallel=m.parallel,
        route=cfg.network.route(os.environ),
        ca_file=m.ca_file,
    )


@dataclass(frozen=True, slots=True)
class Plane:
    """This control plane among several (on etcd): its name, the cluster CA (with its key),
    and its lease in the store (0 while it has none)."""

    name: str
    ca: pki.CertKey
    lease: Callable[[], int]


async def start(
    cfg: ServerConfig, state_dir: Path, store: Store, catalog: Catalog, plane: Plane | None = None
) -> Mirror:
    """Open the mirror, read each set's shape when it is whole, and carry on fetching the
    sets of the catalog's models that a stop cut short. Among several control planes, every
    one holds every model's set, fetched from upstream once (mirror.fleet)."""
    mirror = Mirror(settings(cfg, state_dir), Records(store))
    log.info("mirror: the upstream and peers through %s", mirror.settings.route.shown())
    await mirror.start()
    follow_catalog(mirror, catalog)
    if plane is not None:
        join_fleet(mirror, store, plane, state_dir / "pki")
        catalog.on_change(lambda: fetch_models(mirror, catalog))
    fetch_models(mirror, catalog)
    task = asyncio.get_running_loop().create_task(peers.run(mirror))
    _pending.add(task)
    _pending.add(asyncio.get_running_loop().create_task(DiskCheck(mirror, catalog).run()))
    return mirror


def fetch_models(mirror: Mirror, catalog: Catalog) -> None:
    """Fetch every model's set this mirror lacks (those whole or in flight are left be)."""
    for model in catalog.all():
        if sources.is_hf(model.source) and model.files:
            mirror.fetch(model.source, list(model.files))


def join_fleet(
    mirror: Mirror, store: Store, plane: Plane, pki_dir: Path, wait_s: float = fleet.WAIT_S
) -> None:
    """Fetch sets with the other control planes: claims and holdings in the store, files
    copied from their cluster ports with a client certificate made here with the CA."""
    cert, key = pki_dir / "plane.pem", pki_dir / "plane.key"
    pki_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    pki.write_pair(pki.make_plane_cert(plane.ca, plane.name), cert, key)
    mirror.plane_tls = pki.client_context(plane.ca.cert_pem, cert, key)
    mirror.fleet = fleet.Fleet(Holders(store, plane.name, plane.lease), wait_s)


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


def hub(
    mirror: Mirror, catalog: Catalog, allows: Callable[[ApiKey, str], bool] | None = None
) -> web.Application:
    """/hf: the hub's protocol over the mirror, for any live llmgw key, and the listing of
    its whole sets that its peers copy from. Staff keys see every set; another key the sets of
    the models it may use: allows (the router's Meter.allows; None: every model)."""
    scopes = hub_auth.KeyScopes(catalog, allows or _every_model, staff_check(catalog.store))
    app: web.Application = hub_server.hub_app(mirror, hub_auth.key_auth(catalog, scopes))
    app.router.add_get(peers.LISTING, peers.listing_handler(mirror))
    return app


def _every_model(_key: ApiKey, _model: str) -> bool:
    return True


def staff_check(store: Store) -> Callable[[ApiKey], Awaitable[bool]]:
    """Whether a key is staff's (any staff role), as /api/v1 decides it (auth.allowed): an
    admin key of no maker, or a staff user's own key (not narrowed to a project), whose role
    is looked up now; the store not answering is a 503 (never a narrower or a wider view)."""
    directory = Directory(store)

    async def is_staff(key: ApiKey) -> bool:
        try:
            return await auth.allowed(auth.of_key(key), auth.STAFF_READ, {}, directory)
        except StoreUnavailable:
            raise hub_server.HubError(503, "the store cannot be reached", headers=_RETRY) from None

    return is_staff


_RETRY = {"Retry-After": str(hub_server.RETRY_AFTER_S)}
