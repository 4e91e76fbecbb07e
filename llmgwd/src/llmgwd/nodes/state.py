"""The cluster's state in llmgwd: each node, what its agent reports and what it should run;
what the leader, the router and the API read."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import WSCloseCode

from llmgw import pki, wire
from llmgwd.mirror.holdings import Holdings
from llmgwd.nodes.agent_conn import AgentConn, not_leader_reason, refuse, send
from llmgwd.nodes.members import Members, removed_reason
from llmgwd.nodes.pool import Endpoint

log = logging.getLogger(__name__)

OnChange = Callable[[str], None]  # called with the node's name


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


@dataclass
class _Node:
    register: wire.Register
    replicas: tuple[wire.ReplicaStatus, ...]
    inventory: wire.Inventory
    seen: float  # on ClusterState's clock, for the grace period
    seen_unix: float  # for people
    conn: AgentConn | None = None
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
        # Nodes told nothing of Slurm in this term (no controller known): their Desired
        # says pending, and each keeps its Slurm as it is.
        self._slurm_untold: set[str] = set()
        self._tasks: set[asyncio.Task[object]] = set()  # strong refs to background work
        self._removed: set[str] = set()  # removed since start: no connection is attached
        self.holdings = Holdings()  # what each node's model cache holds
        # Leadership (leader.py): a standby refuses agents, naming the leader's cluster URL.
        self.leading = True
        self.leader_url = ""
        self._control_planes: tuple[str, ...] = ()  # every control plane's URL, for agents
        # Each node's latest UpgradeReport not yet taken by the roll (upgrade/driver.py).
        self.upgrade_reports: dict[str, wire.UpgradeReport] = {}

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
        if self._slurm.get(node) == part and node not in self._slurm_untold:
            return
        self._slurm_untold.discard(node)
        if part is None:
            self._slurm.pop(node, None)
        else:
            self._slurm[node] = part
        entry = self._nodes.get(node)
        if entry is not None and entry.conn is not None and self._slurm_loaded:
            self._spawn(self._send_desired(entry.conn))  # before: slurm_loaded() sends it

    def slurm_untold(self, node: str) -> None:
        """Tell node nothing of Slurm (its Desired says pending: it keeps what it runs), as
        before the Slurm task loaded, until set_slurm."""
        if node in self._slurm_untold:
            return
        self._slurm_untold.add(node)
        self._slurm.pop(node, None)
        entry = self._nodes.get(node)
        if entry is not None and entry.conn is not None and self._slurm_loaded:
            self._spawn(self._send_desired(entry.conn))

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
        self._slurm_untold.discard(node)
        self.holdings.drop(node)
        entry = self._nodes.pop(node, None)
        if entry is None:
            return False
        if entry.lost_timer is not None:
            entry.lost_timer.cancel()
        if entry.conn is not None:
            self._spawn(refuse(entry.conn, removed_reason(node)))
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
                self._spawn(refuse(entry.conn, reason, leader_url))
        self._nodes.clear()
        self._desired.clear()
        self._slurm.clear()
        self._slurm_untold.clear()
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
        self._spawn(send(entry.conn, sweep))
        return True

    def send_upgrade(self, node: str, msg: wire.Upgrade) -> str:
        """Tell node's agent to upgrade; "" when sent, else why it cannot be."""
        entry = self._nodes.get(node)
        if entry is None or entry.conn is None:
            return "its agent is not connected"
        if not entry.register.upgrades:
            return (
                f"its llmgw-agentd {entry.register.version or '(unknown)'} predates `llmgw "
                "upgrade`: upgrade it by hand (apt-get or dnf install ./FILE), then resume"
            )
        if msg.from_repositories and not entry.register.repository_upgrades:
            return (
                f"its llmgw-agentd {entry.register.version or '(unknown)'} cannot install from "
                "the repositories (it would install nothing): upgrade it by hand (apt-get or "
                "dnf install), then resume"
            )
        self._spawn(send(entry.conn, msg))
        return ""

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

    # The agents' side (called by the /agent handler, agent_session.py)

    async def _attach(self, conn: AgentConn, msg: wire.Register) -> None:
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

    def _report(self, conn: AgentConn, msg: wire.Heartbeat) -> None:
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

    def _held(self, conn: AgentConn, msg: wire.Holdings) -> None:
        entry = self._nodes.get(conn.node)
        if entry is not None and entry.conn is conn:
            self.holdings.update(conn.node, msg.files, msg.sweep)

    def _upgrade_report(self, conn: AgentConn, msg: wire.UpgradeReport) -> None:
        entry = self._nodes.get(conn.node)
        if entry is not None and entry.conn is conn:
            self.upgrade_reports[conn.node] = msg

    def _detach(self, conn: AgentConn) -> None:
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

    async def _send_desired(self, conn: AgentConn) -> None:
        async with conn.lock:
            # Read under the lock, so the last send always carries the latest desired state.
            replicas = list(self._desired.get(conn.node, ()))
            try:
                planes = list(self._control_planes)
                pending = not self._slurm_loaded or conn.node in self._slurm_untold
                slurm = None if pending else self._slurm.get(conn.node)
                msg = wire.Desired(
                    replicas, renews=True, mirror=True, control_planes=planes, slurm=slurm,
                    stopping=True, slurm_pending=pending, upgrades=True,
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


def _host(address: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address  # a DNS name
