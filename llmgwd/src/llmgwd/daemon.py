"""llmgwd put together: store, catalog, usage, cluster port, reconciler, /v1, /api/v1, local
socket."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import secrets
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from prometheus_client import CollectorRegistry

from llmgw import entry, fdstore, localsock, pki, sdnotify
from llmgw.config import ServerConfig
from llmgwd import memory_bound
from llmgwd.accounting.allotments import Allotments
from llmgwd.accounting.levels import Levels
from llmgwd.accounting.usage import Usage
from llmgwd.api import login
from llmgwd.api.access import key_auth, peercred_auth
from llmgwd.api.base import API_PREFIX, ApiContext, ClusterNodes
from llmgwd.api.routes import api_app, api_subapp
from llmgwd.catalog import Catalog
from llmgwd.clientport import listener, own_cert, reload
from llmgwd.console import app as console
from llmgwd.metrics import endpoint as metrics
from llmgwd.metrics.cluster import ClusterCollector
from llmgwd.metrics.engines import EngineRelay
from llmgwd.metrics.gpus import GpuCollector
from llmgwd.metrics.health import build as health_series
from llmgwd.metrics.scrape import Scraper
from llmgwd.mirror import setup as mirror_setup
from llmgwd.nodes import port as cluster_port
from llmgwd.nodes.members import Members
from llmgwd.nodes.state import ClusterState, remove_node
from llmgwd.people.ldap import LdapGroups
from llmgwd.people.records import User
from llmgwd.planes import registry, setup
from llmgwd.planes.leader import Election, LeaderRecord
from llmgwd.planes.live import Published, RolePool
from llmgwd.planes.roles import Roles
from llmgwd.planes.session import Session
from llmgwd.planes.wakeups import Waker
from llmgwd.providers.credentials import Credentials
from llmgwd.router import Router, isolation, transcriptions
from llmgwd.router.metering import Meter
from llmgwd.router.rates import Rates
from llmgwd.scim import app as scim
from llmgwd.scim.base import ScimContext
from llmgwd.slurm.settings import SettingsStore
from llmgwd.store.open import open_store

log = logging.getLogger("llmgwd")
# How long start-up waits for the published replicas before serving /v1 without them.
PUBLISHED_WAIT_S = 10.0
LOCAL_SHUTDOWN_S = 4.0  # the local socket's answers in flight at a stop


@dataclass(frozen=True, slots=True)
class Pki:
    """The cluster CA and the cluster port's certificate, as files in the state dir."""

    ca: pki.CertKey
    server_cert: Path
    server_key: Path


def split_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT' (or '[v6]:PORT') into its parts."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def advertise_url(config: ServerConfig) -> str:
    """The cluster port's URL as nodes dial it."""
    if config.cluster.advertise:
        return config.cluster.advertise.rstrip("/")
    _, port = split_listen(config.cluster.listen)
    return f"https://{socket.getfqdn()}:{port}"


def server_name(url: str) -> str:
    """This control plane's name among the others (/servers/NAME): its advertised host."""
    return urlsplit(url).hostname or socket.gethostname()


def load_secret(path: Path) -> bytes:
    """The cluster secret (engine keys derive from it), made at the first start."""
    if not path.exists():
        pki.write_pem(path, secrets.token_bytes(32), private=True)
        log.info("made the cluster secret in %s", path)
    return path.read_bytes()


def _sans(url: str) -> tuple[list[str], list[str]]:
    """DNS names and IPs the cluster port's certificate must carry."""
    host = urlsplit(url).hostname or ""
    names = {socket.gethostname(), socket.getfqdn()}
    ips: set[str] = set()
    try:
        ipaddress.ip_address(host)
        ips.add(host)
    except ValueError:
        if host:
            names.add(host)
    return sorted(n for n in names if n), sorted(ips)


def load_pki(state_dir: Path, url: str) -> Pki:
    """The CA and server certificate, made at the first start; the server certificate is
    made again when the advertised host is not in it."""
    d = state_dir / "pki"
    d.mkdir(mode=0o700, exist_ok=True)
    ca_cert, ca_key = d / "ca.pem", d / "ca.key"
    if not ca_cert.exists():
        pki.write_pair(pki.make_ca(), ca_cert, ca_key)
        log.info(
            "made the cluster CA in %s (fingerprint %s)",
            d,
            pki.ca_fingerprint(ca_cert.read_bytes()),
        )
    ca = pki.read_pair(ca_cert, ca_key)
    cert, key = d / "server.pem", d / "server.key"
    names, ips = _sans(url)
    stamp = d / "server.sans"
    want = " ".join(names + ips)
    if not cert.exists() or not stamp.exists() or stamp.read_text() != want:
        pki.write_pair(pki.make_server_cert(ca, names, ips), cert, key)
        stamp.write_text(want)
    return Pki(ca=ca, server_cert=cert, server_key=key)


class Daemon:
    """Everything llmgwd runs, started in order and stopped in reverse."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Open the store, bring up every port, then tell systemd we are ready."""
        cfg = self.config
        state_dir = Path(cfg.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (start-up, once)
        url = advertise_url(cfg)
        sdnotify.status("opening the store")
        secret = load_secret(state_dir / "secret")
        keys = load_pki(state_dir, url)
        self.store = await open_store(cfg, state_dir)
        self.levels = Levels()  # limits above keys (accounting.levels), kept by the catalog's watch
        self.catalog = Catalog(self.store, followers=(self.levels,))
        self.members = Members(self.store)
        revision = await self.catalog.load()
        self.usage = Usage(self.store)
        etcd = cfg.store.backend == "etcd"
        self.shares = Allotments(self.store, keys_in=self.levels.keys_in) if etcd else None
        if self.shares is not None:  # several control planes: each spends its share of a limit
            await self.shares.start()
        self.meter = Meter(self.usage, shares=self.shares, levels=self.levels)
        await self.meter.load()  # budgets go on from what this month used before a restart
        self.usage.start()
        self.cluster = ClusterState(grace_s=cfg.node_grace_s)
        self.mirror = await mirror_setup.start(
            cfg, state_dir, self.store, self.catalog, plane=self._mirror_plane(keys, url)
        )
        self._start_roles(url, secret)
        self.planes = setup.build(cfg, self.store, keys.ca, secret, name=server_name(url), url=url)
        for work in self.planes.tasks():  # the promoter of joined members (etcd only)
            self._spawn(work)
        self._spawn(self.catalog.follow(revision))
        self._spawn(sdnotify.watchdog())
        ctx = self._api_context(keys, url)
        ctx.credentials = Credentials(secret)  # external providers' credentials, sealed
        await self._serve_cluster(keys)
        await self._published_loaded()
        await self._serve_client(ctx, secret, keys)
        await self._serve_local(ctx)
        sdnotify.ready(f"serving /v1 on {cfg.client.listen}, agents on {cfg.cluster.listen}")
        log.info(
            "llmgwd serving: client port %s, cluster port %s (%s), socket %s",
            cfg.client.listen,
            cfg.cluster.listen,
            url,
            cfg.socket,
        )

    async def _published_loaded(self) -> None:
        """Wait (bounded) for the replicas the leader published: a request that waited in the
        client port's queue through a restart is routed by them, not refused with none."""
        try:
            await asyncio.wait_for(self.published.loaded.wait(), PUBLISHED_WAIT_S)
        except TimeoutError:
            log.warning("the published replicas are not read yet: serving /v1 without them")

    def _api_context(self, keys: Pki, url: str) -> ApiContext:
        """What /api/v1's handlers reach: the catalog, the nodes, the usage, the roles."""
        cfg = self.config
        return ApiContext(
            catalog=self.catalog,
            nodes=ClusterNodes(self.cluster.nodes),
            mint_token=lambda: pki.new_join_token(keys.ca.cert_pem),
            join_url=url,
            ca_fingerprint=pki.ca_fingerprint(keys.ca.cert_pem),
            token_ttl_s=cfg.join_token_ttl_s,
            name=cfg.name,
            usage=self.usage,
            scheduling=self.roles,
            remove_node=self.remove_node,
            mirror=self.mirror,
            node_files=mirror_setup.NodeFilesOf(self.cluster),
            control_planes=self.planes.planes,
            slurm=SettingsStore(self.store),
            slurm_status=self.roles.slurm_status,
        )

    def _start_roles(self, url: str, secret: bytes) -> None:
        """The lease, the election and what each role runs: only the leader reconciles and
        takes agents; every control plane follows the replicas the leader publishes."""
        cfg = self.config
        name = server_name(url)
        self.session = Session(self.store, cfg.leader_ttl_s, on_new_lease=self._announce)
        members = self._plane_names if cfg.store.backend == "etcd" else None
        self.announcer = registry.Announcer(
            self.store, name, url, lambda: self.session.lease, members
        )
        self.election = Election(self.store, self.session, LeaderRecord(name, url))
        self.roles = Roles(self.store, self.catalog, self.cluster, secret, self.election,
                           self.announcer, grace_s=cfg.node_grace_s,
                           isolated_cache=cfg.client.cache_isolation != "none",
                           slurm_hold_s=cfg.slurm_hold_s)  # fmt: skip
        self.catalog.on_change(self.roles.poke)
        self.published = Published(self.store, secret)
        local = lambda: self.roles.reconciler  # noqa: E731
        self.waker = Waker(self.store, name, local, lambda: self.session.lease)
        for work in (self.session.run(), self.announcer.run(), self.published.follow(),
                     self.roles.follow_view(), self.election.run(self.roles.lead)):  # fmt: skip
            self._spawn(work)

    def _mirror_plane(self, keys: Pki, url: str) -> mirror_setup.Plane | None:
        """On etcd (several control planes) each set is fetched upstream once and copied."""
        if self.config.store.backend != "etcd":
            return None

        def lease() -> int:
            session: Session | None = getattr(self, "session", None)  # made just after
            return session.lease if session is not None else 0

        return mirror_setup.Plane(server_name(url), keys.ca, lease)

    async def _plane_names(self) -> list[str]:
        """The control planes joined to the etcd store (its members), running or not."""
        etcd = self.planes.planes.etcd  # setup.build runs just after _start_roles
        return [m.name for m in await etcd.members()] if etcd is not None else []

    def _stale_s(self) -> float:
        """How long this control plane has been cut off from the etcd store past its grace
        (0: not, or on SQLite, which is this host's own file)."""
        if self.config.store.backend != "etcd":
            return 0.0
        return self.session.stale_s(self.config.store_grace_s)

    def _announce(self, _lease: int) -> None:
        self.announcer.renew()

    async def _serve_cluster(self, keys: Pki) -> None:
        app = cluster_port.make_app(
            self.cluster, keys.ca, self.catalog.consume_token, self.members, files=self.mirror
        )
        self.planes.add_route(app)  # POST /servers/join
        ctx = cluster_port.server_ssl_context(keys.ca.cert_pem, keys.server_cert, keys.server_key)
        host, port = split_listen(self.config.cluster.listen)
        self._runners.append(await cluster_port.serve(app, host, port, ctx))

    async def remove_node(self, name: str) -> bool:
        """`llmgw node remove`: revoke the node's certificates in the store, then forget it here
        (its connection closed, its replicas placed elsewhere). Whether the node was known."""
        placed = [p.node for p in self.roles.placements()]
        return await remove_node(self.cluster, self.members, name, placed)

    async def _serve_client(self, ctx: ApiContext, secret: bytes, keys: Pki) -> None:
        cfg = self.config.client
        memory_bound.check(cfg)  # its unit's MemoryMax against what these settings call for
        pool = RolePool(self.cluster, self.published)
        self.registry = CollectorRegistry()  # /metrics' own, not prometheus_client's global one
        self.router = Router(
            self.catalog,
            self.catalog,
            pool,
            max_body_bytes=cfg.max_body_bytes,
            uploads=transcriptions.Uploads(cfg.max_uploads_in_flight),
            meter=self.meter,
            on_demand=self.waker,
            stale_s=self._stale_s,
            prefix_aware=cfg.prefix_balancing,
            registry=self.registry,
            count=cfg.request_metrics,
            cache_isolation=isolation.mode(cfg.cache_isolation),
            salt_secret=secret,
            egress=self.config.network.route(os.environ),  # external providers are outside
            provider_deadline_s=cfg.provider_deadline_s,
        )
        ctx.traffic = Rates(self.router.metrics.requests) if cfg.request_metrics else None
        # llama.cpp's slots are reused only while this control plane is the only one.
        self.router.isolation.wait_for_planes()
        self._spawn(registry.follow(self.store, self.router.isolation.planes))
        self._register_metrics(pool)
        self.cluster.on_lost = self.router.node_lost
        app = web.Application(client_max_size=cfg.max_body_bytes)
        app.add_subapp("/v1", self.router.app)
        route = self.config.network.route(os.environ)  # the OIDC provider is outside
        after = self._ldap_groups()  # the directory's groups read at each sign-in
        signin = login.login_app(self.catalog, self.config.oidc, route, after)  # the console's too
        app.add_subapp(login.PREFIX, signin)  # no key
        api = api_subapp(ctx, key_auth(self.catalog))
        app.add_subapp(API_PREFIX, api)
        own_tls = self._own_tls(keys)  # None: the site's certificate, or none
        # Either certificate: the console's cookies are Secure, and plain HTTP is sent to TLS.
        tls, url = bool(cfg.tls_cert) or own_tls is not None, cfg.public_url
        made = console.make(api, self.catalog, secret, tls=tls, login=signin, public_url=url)
        console.mount(app, made)
        app.add_subapp("/hf", mirror_setup.hub(self.mirror, self.catalog, self.meter.allows))
        scim_ctx = ScimContext(self.catalog, self.config.oidc.rules)  # groups by oidc.rules
        app.add_subapp(scim.PREFIX, scim.scim_app(scim_ctx))  # its own token, no key
        store, open_ = self.catalog.store, self.config.metrics.loopback_open
        for path, render in ((metrics.PATH, self.scraper.render),
                             (metrics.ENGINES_PATH, self.engine_metrics.render)):  # fmt: skip
            app.router.add_get(path, metrics.client_handler(render, self.catalog, store, open_))
        host, port = split_listen(cfg.listen)
        self.client_runner = await listener.serve(app, cfg, host, port, own_tls)
        self._runners.append(self.client_runner)

    def _ldap_groups(self) -> Callable[[User], Awaitable[None]] | None:
        """The LDAP directory's groups kept as memberships (ldap.url): on a timer, and at each
        sign-in through what this returns; None when there is no directory."""
        if not self.config.ldap.url:
            return None
        leading = self._leads
        groups = LdapGroups(self.catalog.store, self.config.ldap, self.config.oidc, leading)
        self._spawn(groups.run())
        return groups.signed_in

    def _leads(self) -> bool:
        """Whether this control plane leads now (the one that reads the directory on a timer)."""
        return self.election.leading

    def _own_tls(self, keys: Pki) -> ssl.SSLContext | None:
        """The client port's certificate from the cluster CA, renewed while llmgwd runs, when
        the site configures none (client.tls_cert)."""
        if self.config.client.tls_cert:
            return None
        sans = lambda: own_cert.host_sans(self.config)  # noqa: E731
        own = own_cert.OwnCert(keys.ca, keys.server_cert.parent, sans)
        tls = own.load()
        self._spawn(own.run())
        return tls

    def _register_metrics(self, pool: RolePool) -> None:
        """The cluster's, the GPUs', the budgets', the store's and the certificates' series."""
        models = lambda: [m.name for m in self.catalog.all()]  # noqa: E731
        queued, grace = self.router.balancer.queued, self.config.node_grace_s
        passes = lambda: (r.passes, r.pass_s) if (r := self.roles.reconciler) else None  # noqa: E731
        nodes = self.cluster.nodes
        cluster_state = ClusterCollector(models, pool, nodes, queued, grace, passes)
        health = health_series(self.config, self.catalog, self.levels, self.planes.planes.etcd)
        for work in health.tasks():  # budgets and the store's quorum, refreshed in the background
            self._spawn(work)
        self.health = health
        # Read on the loop at each scrape, built and formatted in a thread with the router's.
        self.scraper = Scraper(self.registry, [cluster_state, GpuCollector(nodes),
                                               *health.collectors()])  # fmt: skip
        self.engine_metrics = EngineRelay(models, pool)  # /metrics/engines

    async def _serve_local(self, ctx: ApiContext) -> None:
        path = Path(self.config.socket)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # noqa: ASYNC240 (a socket left by a killed llmgwd)
        app = api_app(ctx, peercred_auth(self.config.socket_group))
        app.router.add_get(metrics.PATH, metrics.socket_handler(self.scraper.render))
        app.router.add_get(metrics.ENGINES_PATH, metrics.socket_handler(self.engine_metrics.render))
        # Its answers in flight (a backup's stream) get LOCAL_SHUTDOWN_S at a stop: with the
        # client port's, within the unit's TimeoutStopSec=30s.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=LOCAL_SHUTDOWN_S)
        await runner.setup()
        await web.UnixSite(runner, str(path)).start()
        localsock.secure_socket(str(path), self.config.socket_group)
        self._runners.append(runner)

    def reload(self) -> None:
        """Read server.yaml and the client port's certificate again (clientport.reload)."""
        server = self.client_runner.server
        assert isinstance(server, listener.ClientServer)
        reload.reload(server, self.config, lambda: entry.reread(ServerConfig))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        task.add_done_callback(_log_end)
        self._tasks.append(task)

    async def stop(self) -> None:
        """Stop serving, write the usage counted, then flush and close the store."""
        sdnotify.stopping()
        for runner in reversed(self._runners):
            await runner.cleanup()
        await self.usage.stop()  # after the runners: every request has settled by now
        if self.shares is not None:
            await self.shares.stop()  # what this control plane did not use goes back
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.router.close()
        await self.engine_metrics.close()
        await self.mirror.close()
        await self.session.close()  # standbys take over at once rather than at the lease's TTL
        await self.planes.close()
        await self.store.close()
        log.info("llmgwd stopped")


def _log_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task ended", exc_info=task.exception())


async def run(config: ServerConfig, make: Callable[[ServerConfig], Daemon] = Daemon) -> None:
    """Run llmgwd (as make makes it: llmgwd.mirror_only's, by the mode) until SIGTERM or SIGINT."""
    daemon = make(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await daemon.start()
        loop.add_signal_handler(signal.SIGHUP, daemon.reload)  # `systemctl reload llmgwd`
        entry.settle_heap()  # what start-up built leaves the collector's generations
        await stop.wait()
        await daemon.stop()
    except BaseException:
        # Failing (not stopping when asked): systemd is to close the client port rather than
        # hold it through restarts that may fail the same way (clients refused, not queued).
        if not stop.is_set():
            fdstore.forget(listener.FDNAME)
        raise
    os.environ.pop("NOTIFY_SOCKET", None)
