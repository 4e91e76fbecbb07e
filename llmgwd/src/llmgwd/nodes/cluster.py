"""The cluster port of llmgwd: the CA, node joins, and the agents' WebSocket; what agents report."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import WSCloseCode, WSMessage, WSMsgType, web
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from llmgw import pki, wire
from llmgw.errors import cluster_error
from llmgwd.mirror import node_files
from llmgwd.mirror.holdings import Holdings
from llmgwd.nodes.members import Members, refusal, removed_reason
from llmgwd.nodes.pool import Endpoint

log = logging.getLogger(__name__)

ConsumeToken = Callable[[str], Awaitable[bool]]
OnChange = Callable[[str], None]  # called with the node's name

PING_S = 10.0  # WebSocket pings: a silent dead peer is dropped within 1.5x this
REGISTER_TIMEOUT_S = 10.0
MAX_MESSAGE_BYTES = 1 << 20
MAX_JOIN_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node as the control plane sees it now."""

    name: str
    address: str
    version: str
    inventory: wire.Inventory
    replicas: tuple[wire.ReplicaStatus, ...]
    desired: tuple[wire.ReplicaSpec, ...] | None  # None: nothing decided for it yet
    connected: bool
    last_seen: float  # unix time of its last message (or of its disconnection)
    silent_s: float = 0.0  # seconds since it was last heard from; 0 while connected


@dataclass(eq=False)
class _Conn:
    """One agent's WebSocket and the lock that keeps its sends whole and in order."""

    node: str
    ws: web.WebSocketResponse
    peer: str
    serial: str  # of the certificate the connection was admitted with
    key: bytes  # that certificate's public key (SubjectPublicKeyInfo, DER)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class _Node:
    register: wire.Register
    replicas: tuple[wire.ReplicaStatus, ...]
    inventory: wire.Inventory
    seen: float  # on ClusterState's clock, for the grace period
    seen_unix: float  # for people
    conn: _Conn | None = None
    lost_timer: asyncio.TimerHandle | None = None  # set while disconnected, within the grace
    # The engines' URL host, parsed once per registration rather than on every request.
    host: str = field(init=False)

    def __post_init__(self) -> None:
        self.host = _host(self.register.address)

    def touch(self, now: float) -> None:
        self.seen = now
        self.seen_unix = time.time()


class ClusterState:
    """In-memory observed state of the nodes plus the replicas each one should run (a Pool)."""

    def __init__(
        self,
        grace_s: float = 60.0,
        *,
        on_change: OnChange | None = None,
        on_lost: OnChange | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grace_s = grace_s
        self.on_change = on_change
        self.on_lost = on_lost  # called once a disconnected node's grace period ends
        self._clock = clock
        self._nodes: dict[str, _Node] = {}
        self._desired: dict[str, tuple[wire.ReplicaSpec, ...]] = {}
        # ready()'s answer per model (read at every /v1 request) and the clock's time until
        # which it holds (a disconnected node's grace ends); emptied at every change of nodes,
        # their replicas or their desired sets.
        self._ready: dict[str, tuple[tuple[Endpoint, ...], float]] = {}
        self._slurm: dict[str, wire.SlurmPart] = {}  # each node's part in Slurm (slurm/task.py)
        # Until the Slurm task has loaded its view in this term, a Desired says so and
        # carries no part (the agent keeps its Slurm as it is).
        self._slurm_loaded = False
        self._tasks: set[asyncio.Task[object]] = set()  # strong refs to background work
        self._removed: set[str] = set()  # removed since start: no connection is attached
        self.holdings = Holdings()  # what each node's model cache holds
        # Leadership (leader.py): a standby refuses agents, naming the leader's cluster URL.
        self.leading = True
        self.leader_url = ""
        self._control_planes: tuple[str, ...] = ()  # every control plane's URL, for agents

    # The reconciler's side

    def set_desired(self, node: str, replicas: Sequence[wire.ReplicaSpec]) -> None:
        """Store what node should run; send it at once if connected, else on its Register."""
        desired = tuple(replicas)
        if self._desired.get(node) == desired:
            return  # the reconciler pushes every pass; the agent already has this
        self._desired[node] = desired
        self._ready.clear()
        entry = self._nodes.get(node)
        if entry is not None and entry.conn is not None:
            self._spawn(self._send_desired(entry.conn))

    def set_slurm(self, node: str, part: wire.SlurmPart | None) -> None:
        """Store node's part in Slurm (None: none); sent with its Desired when it changed."""
        if self._slurm.get(node) == part:
            return
        if part is None:
            self._slurm.pop(node, None)
        else:
            self._slurm[node] = part
        entry = self._nodes.get(node)
        if entry is not None and entry.conn is not None and self._slurm_loaded:
            self._spawn(self._send_desired(entry.conn))  # before: slurm_loaded() sends it

    def slurm_loaded(self) -> None:
        """The Slurm task has loaded its view and set each node's part: every node told
        its set so far is told again, its part with it."""
        if self._slurm_loaded:
            return
        self._slurm_loaded = True
        for name, entry in self._nodes.items():
            if entry.conn is not None and (name in self._desired or name in self._slurm):
                self._spawn(self._send_desired(entry.conn))

    def remove(self, node: str) -> bool:
        """A node removed from the cluster: its connection is refused and closed, it is
        forgotten (its replicas are placed elsewhere, its requests in flight moved), and no
        connection of it is attached again until allow(). Whether it was known here."""
        self._removed.add(node)
        self._ready.clear()
        self._desired.pop(node, None)
        self._slurm.pop(node, None)
        self.holdings.drop(node)
        entry = self._nodes.pop(node, None)
        if entry is None:
            return False
        if entry.lost_timer is not None:
            entry.lost_timer.cancel()
        if entry.conn is not None:
            self._spawn(_refuse(entry.conn, removed_reason(node)))
        log.warning("node %s removed from the cluster; its certificates are refused", node)
        self._tell_lost(node)
        self._changed(node)
        return True

    def set_control_planes(self, urls: Sequence[str]) -> None:
        """Every control plane's cluster URL: told to each agent (with its Desired)."""
        planes = tuple(sorted(urls))
        if planes == self._control_planes:
            return
        self._control_planes = planes
        for entry in self._nodes.values():
            if entry.conn is not None:
                self._spawn(self._send_desired(entry.conn))

    def stand_by(self, leader_url: str) -> None:
        """This control plane stopped leading: every agent is told where the leader is (as
        far as known) and closed, and what they reported is forgotten (the next leader
        rebuilds it from their reports)."""
        self.leading = False
        self.leader_url = leader_url
        reason = not_leader_reason(leader_url)
        for entry in self._nodes.values():
            if entry.lost_timer is not None:
                entry.lost_timer.cancel()
            if entry.conn is not None:
                self._spawn(_refuse(entry.conn, reason, leader_url))
        self._nodes.clear()
        self._desired.clear()
        self._slurm.clear()
        self._slurm_loaded = False
        self.holdings = Holdings()

    def decided(self) -> list[str]:
        """Nodes registered since start (or since this term began) that were told their set."""
        return [name for name in self._nodes if name in self._desired]

    def send_sweep(self, node: str, sweep: wire.Sweep) -> bool:
        """Ask node's agent to sweep its cache (its answer reaches holdings.swept); False
        when the node is not connected."""
        entry = self._nodes.get(node)
        if entry is None or entry.conn is None:
            return False
        self._spawn(_send(entry.conn, sweep))
        return True

    def allow(self, node: str) -> None:
        """A removed node joined again with a token."""
        self._removed.discard(node)

    def removed(self, node: str) -> bool:
        """Whether node was removed since start (and has not joined again)."""
        return node in self._removed

    def placed(self, node: str) -> bool:
        """Whether node has replicas to run (its engines' keys go to its connection)."""
        return bool(self._desired.get(node))

    def connected(self) -> list[str]:
        """Names of the nodes whose agent is connected now."""
        return sorted(name for name, n in self._nodes.items() if n.conn is not None)

    def known(self) -> list[str]:
        """Names of every node that registered since start (connected or not)."""
        return sorted(self._nodes)

    def nodes(self) -> list[NodeInfo]:
        """Every node that has registered since this process started, by name."""
        return [self._info(name, n) for name, n in sorted(self._nodes.items())]

    def node(self, name: str) -> NodeInfo | None:
        """One node, or None if it never registered."""
        entry = self._nodes.get(name)
        return self._info(name, entry) if entry is not None else None

    # The Pool protocol

    def ready(self, model: str) -> list[Endpoint]:
        """Ready replicas of model on nodes connected now or seen within the grace period."""
        now = self._clock()
        cached = self._ready.get(model)
        if cached is None or now >= cached[1]:
            cached = self._ready[model] = self._find_ready(model, now)
        return list(cached[0])

    def _find_ready(self, model: str, now: float) -> tuple[tuple[Endpoint, ...], float]:
        """ready()'s answer, and until when it holds."""
        found: list[Endpoint] = []
        until = math.inf
        for name, entry in sorted(self._nodes.items()):
            if entry.conn is None:
                if now - entry.seen >= self.grace_s:
                    continue
                until = min(until, entry.seen + self.grace_s)
            specs = {s.id: s for s in self._desired.get(name, ()) if s.model == model}
            for status in entry.replicas:
                spec = specs.get(status.id)
                # Without a spec there is no key to give: the replica is not ours to use.
                if spec is None or status.state != "ready" or not 0 < status.port < 65536:
                    continue
                url = f"http://{entry.host}:{status.port}"
                # The engine's own context is what binds a request; the spec's is what it was
                # started with (0 there too: the engine's default, known only from the engine).
                context = status.context or spec.context
                key, priority, slots = spec.api_key, spec.priority, status.slots
                found.append(Endpoint(status.id, model, name, url, key, priority, slots, context))
        return tuple(found), until

    def wanted(self, model: str) -> int:
        """How many replicas of model the desired state places, over all nodes."""
        return sum(1 for specs in self._desired.values() for s in specs if s.model == model)

    # The agents' side (called by the /agent handler)

    async def _attach(self, conn: _Conn, msg: wire.Register) -> None:
        """A registered connection; it replaces an older one of the same node."""
        address = msg.address or conn.peer
        register = msg if msg.address else msgspec.structs.replace(msg, address=address)
        old = self._nodes.get(conn.node)
        if old is not None and old.lost_timer is not None:
            old.lost_timer.cancel()
        self._nodes[conn.node] = _Node(
            register, tuple(msg.replicas), msg.inventory, self._clock(), time.time(), conn
        )
        self._ready.clear()
        if old is not None and old.conn is not None:
            log.info("node %s connected again; closing its older connection", conn.node)
            self._spawn(old.conn.ws.close(message=b"replaced by a newer connection"))
        log.info("node %s registered from %s (engines at %s)", conn.node, conn.peer, address)
        if conn.node in self._desired or conn.node in self._slurm:
            await self._send_desired(conn)
        self._changed(conn.node)

    def _report(self, conn: _Conn, msg: wire.Heartbeat) -> None:
        entry = self._nodes.get(conn.node)
        if entry is None or entry.conn is not conn:
            return  # a replaced connection's last words
        entry.touch(self._clock())
        slurm_changed = msg.inventory.slurm != entry.inventory.slurm  # the Slurm task looks
        entry.inventory = msg.inventory
        replicas = tuple(msg.replicas)
        if replicas != entry.replicas or slurm_changed:
            entry.replicas = replicas
            self._changed(conn.node)

    def _held(self, conn: _Conn, msg: wire.Holdings) -> None:
        entry = self._nodes.get(conn.node)
        if entry is not None and entry.conn is conn:
            self.holdings.update(conn.node, msg.files, msg.sweep)

    def _detach(self, conn: _Conn) -> None:
        entry = self._nodes.get(conn.node)
        if entry is None or entry.conn is not conn:
            return
        entry.conn = None
        self.holdings.forget(conn.node)
        entry.touch(self._clock())
        loop = asyncio.get_running_loop()
        entry.lost_timer = loop.call_later(self.grace_s, self._lost, conn.node, entry)
        log.info("node %s disconnected; lost unless back within %gs", conn.node, self.grace_s)
        self._changed(conn.node)

    def _tell_lost(self, node: str) -> None:
        """Run on_lost (the router moves the node's requests in flight); a failing hook is
        logged, never raised into the cluster's own bookkeeping."""
        if self.on_lost is not None:
            try:
                self.on_lost(node)
            except Exception:
                log.exception("on_lost hook failed for node %s", node)

    def _lost(self, node: str, entry: _Node) -> None:
        """The grace period of a node still disconnected has ended."""
        entry.lost_timer = None
        if self._nodes.get(node) is not entry or entry.conn is not None:
            return
        log.warning("node %s lost: not heard from for %gs", node, self.grace_s)
        self._tell_lost(node)
        self._changed(node)

    async def _close_all(self) -> None:
        """Close every agent connection (the server is stopping)."""
        for entry in self._nodes.values():
            if entry.lost_timer is not None:
                entry.lost_timer.cancel()
            if entry.conn is not None:
                close = entry.conn.ws.close(code=WSCloseCode.GOING_AWAY, message=b"stopping")
                self._spawn(close)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, work: Coroutine[Any, Any, object]) -> None:
        """Run in the background: sends and closes must not wait on a slow or dead peer."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # Helpers

    async def _send_desired(self, conn: _Conn) -> None:
        async with conn.lock:
            # Read under the lock, so the last send always carries the latest desired state.
            replicas = list(self._desired.get(conn.node, ()))
            try:
                planes = list(self._control_planes)
                pending = not self._slurm_loaded
                slurm = None if pending else self._slurm.get(conn.node)
                msg = wire.Desired(
                    replicas, renews=True, mirror=True, control_planes=planes, slurm=slurm,
                    stopping=True, slurm_pending=pending,
                )  # fmt: skip
                await conn.ws.send_bytes(wire.encode(msg))
            except (ConnectionError, RuntimeError) as e:
                log.info(
                    "node %s: desired state not sent (%s); sent again on reconnect", conn.node, e
                )

    def _info(self, name: str, entry: _Node) -> NodeInfo:
        desired = self._desired.get(name)
        return NodeInfo(
            name=name,
            address=entry.register.address,
            version=entry.register.version,
            inventory=entry.inventory,
            replicas=entry.replicas,
            desired=desired,
            connected=entry.conn is not None,
            last_seen=entry.seen_unix,
            silent_s=0.0 if entry.conn is not None else self._clock() - entry.seen,
        )

    def _changed(self, node: str) -> None:
        self._ready.clear()
        if self.on_change is None:
            return
        try:
            self.on_change(node)
        except Exception:
            log.exception("on_change hook failed for node %s", node)


async def remove_node(
    state: ClusterState, members: Members, name: str, placed: Iterable[str] = ()
) -> bool:
    """`llmgw node remove`: revoke the node's certificates in the store, then forget it here
    (its connection refused, its replicas placed elsewhere). The removal is recorded for any
    valid name, known or not, so a certificate of a node that joined before membership
    records were kept and has not connected since start is refused too. Whether the node
    was known (a member, seen since start, or with replicas placed); PKIError: not a name."""
    pki.check_node_name(name)
    member = await members.get(name)
    known = bool(member and member.active) or name in {*state.known(), *placed}
    await members.remove(name)
    state.remove(name)
    return known


STATE_KEY = web.AppKey("cluster_state", ClusterState)


class _Refuse(Exception):
    """End an agent's connection with a Refused message saying why."""


def make_app(
    state: ClusterState,
    ca: pki.CertKey,
    consume_token: ConsumeToken,
    members: Members,
    files: node_files.Blobs | None = None,
) -> web.Application:
    """The cluster port's routes: GET /ca, POST /join, GET /agent (WebSocket), and with
    files, the mirror's files for nodes: GET /mirror/files/{sha256}."""
    app = web.Application(client_max_size=MAX_JOIN_BYTES)
    app[STATE_KEY] = state
    handlers = _Handlers(state, ca, consume_token, members)
    app.router.add_get("/ca", handlers.ca)
    app.router.add_post("/join", handlers.join)
    app.router.add_get("/agent", handlers.agent)
    if files is not None:
        node_files.add_routes(app, files, handlers.node_of)

    async def close_agents(_: web.Application) -> None:
        await state._close_all()

    app.on_shutdown.append(close_agents)
    return app


def server_ssl_context(ca_pem: bytes, cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """The cluster port's TLS: client certs are optional in TLS and required by /agent.

    /ca and /join serve nodes that have no certificate yet, so TLS itself cannot demand
    one; a certificate that is sent must still chain to the cluster CA (TLS checks that),
    and the /agent handler refuses a connection without one.
    """
    return pki.server_context(ca_pem, cert_file, key_file, verify_mode=ssl.CERT_OPTIONAL)


async def serve(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext
) -> web.AppRunner:
    """Bind the cluster port; stop it with `await runner.cleanup()`. Port 0: see bound_port."""
    runner = web.AppRunner(app, shutdown_timeout=5.0, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port the runner's first site listens on."""
    address = runner.addresses[0]
    return int(address[1])


class _Handlers:
    """The cluster port's request handlers."""

    def __init__(
        self, state: ClusterState, ca: pki.CertKey, consume_token: ConsumeToken, members: Members
    ) -> None:
        self._state = state
        self._ca = ca
        self._consume = consume_token
        self._members = members

    async def ca(self, request: web.Request) -> web.Response:
        """The cluster CA; a joining node pins it by the hash in its token."""
        return web.Response(body=self._ca.cert_pem, content_type="application/x-pem-file")

    async def join(self, request: web.Request) -> web.Response:
        """Sign a node's CSR for a valid, unused join token, under a name no member holds."""
        try:
            req = msgspec.json.decode(await request.read(), type=wire.JoinRequest)
            pki.check_csr(req.csr_pem, req.node)  # before the token, so a bad CSR wastes none
        except (msgspec.ValidationError, msgspec.DecodeError, pki.PKIError) as e:
            return _error(400, f"not a valid join request: {e}", "invalid_join")
        except web.HTTPRequestEntityTooLarge:
            return _error(413, "join request too large", "too_large")
        try:
            taken = await self._name_taken(req.node)
            if taken:
                # A token must not take over a member's name (and its engines' keys).
                return _error(409, taken, "node_is_member")
            accepted = await self._consume(req.token)
        except Exception as e:
            # No traceback: it could carry the token the store was given.
            log.error("join of node %r: the store failed (%s)", req.node, type(e).__name__)
            return _error(503, "cannot check the join token now; try again", "store_failed")
        if not accepted:
            log.warning(
                "join of node %r from %s refused: invalid, expired or used token",
                req.node,
                request.remote,
            )
            return _error(403, "the join token is invalid, expired or already used", "bad_token")
        return await self._admit(req, request.remote or "")

    async def _name_taken(self, node: str) -> str:
        """Why a token join under this name is refused ("": it is free)."""
        member = await self._members.get(node)
        if node in self._state.connected():
            why = "is connected now"
        elif member is not None and member.active:
            why = "is a member of the cluster"
        elif member is None and (node in self._state.known() or self._state.placed(node)):
            why = "is a member of the cluster"  # joined before membership records were kept
        else:
            return ""
        return (
            f"node {node!r} {why}; remove it first (llmgw node remove {node}) or pick another name"
        )

    async def _admit(self, req: wire.JoinRequest, remote: str) -> web.Response:
        cert = pki.sign_csr(self._ca, req.csr_pem, req.node)
        if not await self._members.admit(req.node, pki.serial_of(cert)):
            return _error(409, f"node {req.node!r} joined at the same time", "node_is_member")
        self._state.allow(req.node)
        log.info("node %s joined from %s", req.node, remote)
        body = wire.JoinResponse(cert_pem=cert.decode(), ca_pem=self._ca.cert_pem.decode())
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")

    async def agent(self, request: web.Request) -> web.StreamResponse:
        """An agent's WebSocket; the node is the client certificate's CN, never the message's."""
        der = _peer_cert(request)
        ident = pki.node_identity(der) if der else None
        if der is None or ident is None:
            return _error(401, "a node certificate signed by the cluster CA is required")
        ws = web.WebSocketResponse(heartbeat=PING_S, max_msg_size=MAX_MESSAGE_BYTES)
        await ws.prepare(request)
        key = _spki(x509.load_der_x509_certificate(der).public_key())
        conn = _Conn(ident.name, ws, request.remote or "", ident.serial, key)
        if not self._state.leading:
            leader = self._state.leader_url
            await _refuse(conn, not_leader_reason(leader), leader)
            return ws
        try:
            await self._admission(ident)
            await self._converse(conn)
        except _Refuse as e:
            log.warning("node %s (%s): connection refused: %s", ident.name, conn.peer, e)
            await _refuse(conn, str(e))
        finally:
            self._state._detach(conn)
        return ws

    async def node_of(self, request: web.Request) -> str | web.Response:
        """The node a request's client certificate names, admitted as /agent admits it, or
        the answer that refuses it."""
        der = _peer_cert(request)
        ident = pki.node_identity(der) if der else None
        if ident is None:
            return _error(401, "a node certificate signed by the cluster CA is required")
        try:
            await self._admission(ident)
            if self._state.removed(ident.name):
                raise _Refuse(removed_reason(ident.name))
        except _Refuse as e:
            return _error(403, str(e), "refused")
        return ident.name

    async def _admission(self, ident: pki.NodeIdentity) -> None:
        """_Refuse a certificate of a removed node, or one replaced or revoked."""
        try:
            member = await self._members.get(ident.name)
            if member is None and await self._members.adopt(ident.name, ident.serial):
                log.info("node %s: its certificate recorded as a member's", ident.name)
                return
            member = member or await self._members.get(ident.name)
            why = refusal(member, ident.serial)
            if why is None:
                await self._members.used(ident.name, ident.serial)
        except Exception as e:
            log.error("node %s: the store failed (%s)", ident.name, type(e).__name__)
            raise _Refuse("cannot check this node's certificate now; try again") from None
        if why is not None:
            raise _Refuse(why)

    async def _converse(self, conn: _Conn) -> None:
        try:
            first = await conn.ws.receive(timeout=REGISTER_TIMEOUT_S)
        except TimeoutError:
            raise _Refuse(f"no register message within {REGISTER_TIMEOUT_S:g} s") from None
        msg = _decode(first)
        if msg is None:
            return
        register = _check_register(conn.node, msg)
        if self._state.removed(conn.node):  # removed while this connection was checked
            raise _Refuse(removed_reason(conn.node))
        await self._state._attach(conn, register)
        async for frame in conn.ws:
            msg = _decode(frame)
            if msg is None:
                return
            if isinstance(msg, wire.Renew):
                await self._renew(conn, msg)
            elif isinstance(msg, wire.Heartbeat):
                self._state._report(conn, msg)
            elif isinstance(msg, wire.Holdings):
                self._state._held(conn, msg)
            else:
                raise _Refuse("register sent twice on one connection")

    async def _renew(self, conn: _Conn, msg: wire.Renew) -> None:
        """The node's next certificate, for the CSR it sent over its own link."""
        try:
            if _spki(pki.check_csr(msg.csr_pem, conn.node).public_key()) != conn.key:
                raise pki.PKIError("the CSR is not for this node's key (renewal keeps the key)")
            cert = pki.sign_csr(self._ca, msg.csr_pem, conn.node)
        except pki.PKIError as e:
            log.warning("node %s: renewal refused: %s", conn.node, e)
            return
        serial = pki.serial_of(cert)
        try:
            renewed = await self._members.renewed(conn.node, conn.serial, serial)
        except Exception as e:
            # The link stays: the node keeps its certificate and asks again later.
            log.error("node %s: renewal not recorded, the store failed (%s)", conn.node,
                      type(e).__name__)  # fmt: skip
            return
        if not renewed:
            raise _Refuse(removed_reason(conn.node))
        _, until = pki.validity(cert)
        log.info("node %s: certificate renewed (serial %s, until %s)", conn.node, serial, until)
        async with conn.lock:
            with contextlib.suppress(ConnectionError, RuntimeError):  # it asks again if lost
                await conn.ws.send_bytes(wire.encode(wire.Renewed(cert.decode())))


def _check_register(node: str, msg: wire.AgentMessage) -> wire.Register:
    if not isinstance(msg, wire.Register):
        raise _Refuse("the first message must be register")
    if msg.node != node:
        raise _Refuse(f"this certificate is for node {node!r}, not {msg.node!r}")
    if msg.protocol != wire.PROTOCOL:
        raise _Refuse(f"protocol {msg.protocol} is not spoken here (this is {wire.PROTOCOL})")
    return msg


def _decode(frame: WSMessage) -> wire.AgentMessage | None:
    """An agent's message; None when the socket is closing; _Refuse when it is not one."""
    if frame.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
        return None
    if frame.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
        raise _Refuse(f"unexpected WebSocket frame {frame.type.name}")
    try:
        return wire.decode_agent(frame.data)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise _Refuse(f"not a valid message: {e}") from None


async def _send(conn: _Conn, msg: wire.ServerMessage) -> None:
    async with conn.lock:
        with contextlib.suppress(ConnectionError, RuntimeError):  # the node is lost anyway
            await conn.ws.send_bytes(wire.encode(msg))


def not_leader_reason(leader_url: str) -> str:
    """What a standby answers an agent."""
    if leader_url:
        return f"this control plane is not the leader; the leader is {leader_url}"
    return "this control plane is not the leader, and no leader is known now; try the others"


async def _refuse(conn: _Conn, reason: str, leader: str | None = None) -> None:
    """Send Refused and close; leader not None: a standby's refusal, naming the leader."""
    msg = wire.Refused(reason, leader=leader or "", standby=leader is not None)
    async with conn.lock:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await conn.ws.send_bytes(wire.encode(msg))
    await conn.ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"refused")


def _peer_cert(request: web.Request) -> bytes | None:
    """The verified client certificate (DER), if one was sent."""
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    if not isinstance(ssl_object, ssl.SSLObject):
        return None
    return ssl_object.getpeercert(binary_form=True) or None


def _spki(key: PublicKeyTypes) -> bytes:
    """A public key as comparable bytes."""
    return key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)


def _host(address: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address  # a DNS name


def _error(status: int, message: str, code: str = "") -> web.Response:
    return cluster_error(status, message, code)
