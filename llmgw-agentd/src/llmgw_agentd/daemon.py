"""llmgw-agentd put together: engines, the link to the control plane, the local socket."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from pathlib import Path

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler

from llmgw import entry, localsock, package_version, sdnotify, wire
from llmgw.config import AgentConfig
from llmgw.errors import ErrorAnswer, ErrorBody
from llmgw_agentd import dcgm, fwkeep, inventory, layout, link, membw, upgrade
from llmgw_agentd.cache import Cache, Mirror
from llmgw_agentd.gpus import GpuReader
from llmgw_agentd.planes import PLANES_FILE, Planes
from llmgw_agentd.replicas import Replicas
from llmgw_agentd.slurm.keeper import Keeper, Paths
from llmgw_agentd.slurm.setup_unit import SetupUnit
from llmgw_agentd.systemd import Systemd

log = logging.getLogger("llmgw-agentd")


class JoinIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST /api/v1/join: the control plane's URL and a join token."""

    url: str
    token: str


def _error(status: int, message: str, code: str) -> web.Response:
    """An error answer in /api/v1's shape (llmgw.errors.ErrorAnswer)."""
    body = ErrorAnswer(ErrorBody(message, "invalid_request_error", code))
    return web.json_response(msgspec.to_builtins(body), status=status)


class Agent:
    """The node agent: supervises engines and keeps the link to llmgwd up."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.node = config.node_name or socket.gethostname()
        self.pki_dir = Path(config.state_dir) / "pki"
        self.cache = Cache(Path(config.models_dir), self._mirror, on_change=self._held_changed)
        self.replicas = Replicas(config, on_change=self._poke, cache=self.cache)
        self._link: link.Link | None = None
        self._link_task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self._gpus = GpuReader()
        # The node's dcgm-exporter, where agent.yaml names one: counters GPM does not give.
        self._dcgm = dcgm.Exporter(config.dcgm_exporter) if config.dcgm_exporter else None
        self._dcgm_task: asyncio.Task[None] | None = None
        self._bandwidth: membw.Bandwidth | None = None
        self._measuring: asyncio.Task[None] | None = None
        self._planes: Planes | None = None
        self.firewall = fwkeep.Firewall(config.port_range, self._plane_urls)
        self._firewall_task: asyncio.Task[None] | None = None
        # Calls that leave the cluster (engine and package installs) go through it; the link
        # to the control planes and the engines never do.
        self._proxy = config.network.route(os.environ)
        # The node's part in Slurm (llmgw_agentd/slurm), on its own systemd connection.
        self._slurm_bus = Systemd()
        record = Path(config.state_dir) / "slurm-files.json"
        self.slurm = Keeper(
            self.node,
            self._slurm_bus,
            self.firewall.set_slurm,
            SetupUnit(self._slurm_bus, Path(config.state_dir), self._proxy.env()),
            Paths(record=record),
        )
        self._slurm_task: asyncio.Task[None] | None = None
        # llmgw upgrade: the staged packages fetched into the state directory and installed
        # by a transient unit (llmgw_agentd/upgrade.py), on a systemd connection of its own.
        self.upgrader = upgrade.Upgrader(
            Path(config.state_dir) / "upgrade", Systemd(), self._mirror, self._upgrade_report,
            proxy_env=self._proxy.env(),  # apt-get's or dnf's, from the repositories
        )  # fmt: skip

    def _plane_urls(self) -> list[str]:
        """The control planes the engines' ports are open to (none before joining)."""
        return list(self._planes.urls) if self._planes is not None else []

    async def _desired(self, specs: list[wire.ReplicaSpec]) -> None:
        """The leader's Desired (its list of control planes kept by then): the firewall looks
        again at once, so a control plane just named reaches the engines without waiting."""
        self.firewall.poke()
        await self.replicas.apply(specs)

    def _poke(self) -> None:
        if self._link is not None:
            self._link.poke()

    def _upgrade_report(self, report: wire.UpgradeReport) -> None:
        if self._link is not None:
            self._link.report_upgrade(report)

    def _held_changed(self) -> None:
        if self._link is not None:
            self._link.holdings_changed()

    def _mirror(self) -> Mirror:
        """The mirror's files are on the linked control plane's cluster port (mutual TLS),
        and on the other control planes' (asked when it lacks a file or cannot be reached)."""
        joined = link.read_join(self.pki_dir).server
        server = self._link.server if self._link is not None else joined
        planes = Planes(joined, Path(self.config.state_dir) / PLANES_FILE)
        others = tuple(u for u in planes.urls if u != server)
        return Mirror(server, link.link_ssl_context(self.pki_dir), others=others)

    async def _sweep(self, msg: wire.Sweep) -> None:
        """The control plane's sweep: what no replica here runs or fetches goes."""
        await self.cache.sweep(msg.remove, self.replicas.specs(), msg.dry_run)

    async def start(self) -> None:
        """Adopt the engines that run, serve the local socket, dial llmgwd if joined."""
        sdnotify.status("adopting running engines")
        await self.replicas.start()
        await self._serve_local()
        await self.slurm.look()  # before the first Register: what of Slurm runs here
        try:
            joined = link.read_join(self.pki_dir)
        except link.JoinError:
            log.info("not joined to a cluster yet: waiting for `llmgw node join`")
        else:
            self._connect(joined.server)
        self._firewall_task = asyncio.create_task(self.firewall.run())
        if self._dcgm is not None:
            self._dcgm_task = asyncio.create_task(self._dcgm.run(self.config.heartbeat_s))
        await self._start_slurm()
        sdnotify.ready(f"node {self.node}: {len(self.replicas.statuses())} engines")
        # Measured once, after READY: it takes a second or two and must not hold up a restart.
        self._measuring = asyncio.create_task(self._measure_bandwidth())

    async def _start_slurm(self) -> None:
        """Keep the node's Slurm; without systemd's bus it is logged and left (engines run)."""
        try:
            await self._slurm_bus.connect()
        except Exception as e:
            log.warning("no systemd bus for Slurm's units (%s): this node runs no Slurm", e)
            return
        self._slurm_task = asyncio.create_task(self.slurm.run())

    async def _measure_bandwidth(self) -> None:
        try:
            self._bandwidth = await asyncio.to_thread(membw.measure)
        except Exception:
            log.exception("could not measure memory bandwidth; CPU estimates will lack it")
            return
        log.info(
            "memory bandwidth: %.1f GB/s on one core, %.1f GB/s on all",
            self._bandwidth.one_core / 1e9,
            self._bandwidth.all_cores / 1e9,
        )
        self._poke()

    def inventory(self) -> wire.Inventory:
        """What this node has now, as a heartbeat carries it."""
        found = inventory.collect(
            self.config.state_dir,
            self._gpus,
            self._bandwidth,
            models_dir=self.config.models_dir,
        )
        gpus = dcgm.fill(found.gpus, self._dcgm.counters) if self._dcgm else found.gpus
        return msgspec.structs.replace(
            found, gpus=gpus, firewall=self.firewall.status, slurm=self.slurm.report
        )

    def _connect(self, server: str) -> None:
        self._planes = Planes(server, Path(self.config.state_dir) / PLANES_FILE)
        self.firewall.poke()
        self._link = link.Link(
            server,
            self.pki_dir,
            self.node,
            version=package_version(),
            inventory=self.inventory,
            replicas=self.replicas.statuses,
            on_desired=self._desired,
            address=self.config.address,
            on_address=self.replicas.set_host,
            heartbeat_s=self.config.heartbeat_s,
            held=self.cache.held,
            on_sweep=self._sweep,
            planes=self._planes,
            on_slurm=self.slurm.set,
            on_upgrade=self.upgrader.start,
        )
        self._link_task = asyncio.create_task(self._link.run())

    async def _serve_local(self) -> None:
        path = Path(self.config.socket)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # noqa: ASYNC240 (a socket left by a killed agent)
        app = web.Application(middlewares=[self._auth], client_max_size=64 * 1024)
        app.router.add_post("/api/v1/join", self._join)
        app.router.add_get("/api/v1/status", self._status)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(path)).start()
        localsock.secure_socket(str(path), self.config.socket_group)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        cred = localsock.peer_credentials(request)
        if cred is None or not localsock.allowed(cred[1], cred[2], self.config.socket_group):
            return _error(403, f"needs root or the {self.config.socket_group} group", "not_allowed")
        return await handler(request)

    async def _join(self, request: web.Request) -> web.Response:
        try:
            body = msgspec.json.decode(await request.read(), type=JoinIn)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            return _error(400, f"bad join request: {e}", "invalid_body")
        if self._link is not None:
            server = link.read_join(self.pki_dir).server
            if server != body.url.strip().rstrip("/"):
                return _error(409, f"this node has already joined {server}", "already_joined")
            if not self._link.refused:
                # Joining again where it already is: nothing to do, and no token used.
                return web.json_response({"node": self.node, "server": server, "already": True})
            # Removed, or its certificate expired: the token makes it a member again.
        try:
            await link.join(body.url, body.token, self.node, self.pki_dir)
        except link.JoinError as e:
            log.warning("join failed: %s", e)
            return _error(400, str(e), "join_failed")
        await self._disconnect()
        self._connect(link.read_join(self.pki_dir).server)
        return web.json_response({"node": self.node, "server": body.url})

    async def _disconnect(self) -> None:
        """End the link (the engines keep running)."""
        if self._link_task is not None:
            self._link_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._link_task
        self._link = self._link_task = None

    async def _status(self, _: web.Request) -> web.Response:
        data = {
            "node": self.node,
            "connected": self._link.connected if self._link else False,
            "replicas": msgspec.to_builtins(self.replicas.statuses()),
            "firewall": self.firewall.status,
        }
        return web.json_response(data)

    async def stop(self) -> None:
        """Leave the engines running: a new agent adopts them."""
        sdnotify.stopping()
        if self._measuring is not None:
            self._measuring.cancel()
        if self._dcgm_task is not None:
            self._dcgm_task.cancel()
        if self._firewall_task is not None:
            self._firewall_task.cancel()  # the table stays: the next agent finds it
        if self._slurm_task is not None:
            self._slurm_task.cancel()  # slurmd and slurmctld keep running: jobs go on
        await self._slurm_bus.close()
        if self._runner is not None:
            await self._runner.cleanup()
        await self._disconnect()
        await self.replicas.close()
        await self.cache.close()
        await self.upgrader.close()  # its install unit, a unit of its own, runs on
        log.info("llmgw-agentd stopped; engines keep running")


async def run(config: AgentConfig) -> None:
    """Run the agent until SIGTERM or SIGINT."""
    layout.adopt_old(config)  # the cache's directories from before, before anything reads them
    agent = Agent(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await agent.start()
    entry.settle_heap()  # what start-up built leaves the collector's generations
    watchdog = asyncio.create_task(sdnotify.watchdog())
    await stop.wait()
    watchdog.cancel()
    await agent.stop()
