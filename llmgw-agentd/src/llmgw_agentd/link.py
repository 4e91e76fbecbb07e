"""The agent's side of the cluster port: joining the cluster, then the WebSocket to llmgwd."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Literal

import aiohttp
import msgspec

from llmgw import pinned_ca, pki, wire
from llmgw.errors import ClusterError

from . import renew
from .planes import Planes
from .renew import CA_CERT, NODE_CERT, NODE_KEY

log = logging.getLogger(__name__)

JOIN_FILE = "join.json"

MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
PING_S = 10.0  # WebSocket pings: a control plane gone silent is noticed within 1.5x this
CONNECT_TIMEOUT_S = 15.0
MAX_MESSAGE_BYTES = 4 << 20

OnDesired = Callable[[list[wire.ReplicaSpec]], Awaitable[None]]
Held = Callable[[], Sequence[wire.HeldFile]]
OnSweep = Callable[[wire.Sweep], Awaitable[None]]  # deletes what it may; Holdings follow
OnAddress = Callable[[str], None]
# standby: a control plane that does not lead and names no leader; redirect: one that names it
Outcome = Literal["failed", "refused", "lost", "standby", "redirect"]


class JoinError(Exception):
    """Joining failed; the message says why and never holds the token."""


class JoinInfo(msgspec.Struct, frozen=True):
    """join.json: which control plane this node joined, under which name."""

    server: str
    node: str


# Joining


async def join(url: str, token: str, node_name: str, pki_dir: Path) -> None:
    """Join the cluster at url: pin its CA by the token's hash, then trade the token for a cert.

    Nothing is written to pki_dir unless the join succeeds.
    """
    try:
        url = pinned_ca.check_url(url)
        pki.split_join_token(token)
        pki.check_node_name(node_name)
    except (pki.PKIError, pinned_ca.PinError) as e:
        raise JoinError(str(e)) from None
    timeout = aiohttp.ClientTimeout(total=60, connect=CONNECT_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            ca_pem = await pinned_ca.fetch_pinned(session, url, token, "join token")
        except pinned_ca.PinError as e:
            raise JoinError(str(e)) from None
        key_pem, csr_pem = pki.make_node_csr(node_name)
        request = wire.JoinRequest(token=token, node=node_name, csr_pem=csr_pem.decode())
        answer = await _post_join(session, url, request, pki.client_context(ca_pem))
    _check_answer(answer, ca_pem, node_name, key_pem)
    _write_join(pki_dir, JoinInfo(server=url, node=node_name), key_pem, answer)
    log.info("joined %s as node %s", url, node_name)


def read_join(pki_dir: Path) -> JoinInfo:
    """The join.json that join() wrote."""
    path = pki_dir / JOIN_FILE
    try:
        return msgspec.json.decode(path.read_bytes(), type=JoinInfo)
    except FileNotFoundError:
        raise JoinError(f"{path}: this node has not joined a cluster (llmgw node join)") from None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        raise JoinError(f"{path}: cannot be read: {e}") from None


def link_ssl_context(pki_dir: Path) -> ssl.SSLContext:
    """TLS for the link: trust only the cluster CA, present this node's certificate."""
    ca_pem = pki.read_pem(pki_dir / CA_CERT)
    return pki.client_context(ca_pem, pki_dir / NODE_CERT, pki_dir / NODE_KEY)


async def _post_join(
    session: aiohttp.ClientSession, url: str, request: wire.JoinRequest, ctx: ssl.SSLContext
) -> wire.JoinResponse:
    """POST /join over TLS that trusts only the pinned CA."""
    data = msgspec.json.encode(request)
    headers = {"Content-Type": "application/json"}
    try:
        async with session.post(f"{url}/join", data=data, headers=headers, ssl=ctx) as resp:
            body = await resp.read()
            status = resp.status
    except aiohttp.ClientConnectorCertificateError as e:
        raise JoinError(f"{url}: its certificate does not fit: {e.certificate_error}") from None
    except (aiohttp.ClientError, TimeoutError) as e:
        raise JoinError(f"cannot reach {url}: {e or type(e).__name__}") from None
    if status != 200:
        raise JoinError(f"the control plane refused the join: {_reason(body)} (HTTP {status})")
    try:
        return msgspec.json.decode(body, type=wire.JoinResponse)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise JoinError(f"the control plane's join answer is not valid: {e}") from None


def _reason(body: bytes) -> str:
    try:
        error = msgspec.json.decode(body, type=ClusterError).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "no reason given"
    return error[:500]


def _check_answer(answer: wire.JoinResponse, ca_pem: bytes, node_name: str, key_pem: bytes) -> None:
    try:
        same_ca = hmac.compare_digest(pki.ca_fingerprint(answer.ca_pem), pki.ca_fingerprint(ca_pem))
        if not same_ca:
            raise pki.PKIError("it names another CA")
        pki.check_node_cert(answer.cert_pem, ca_pem, node_name, key_pem)
    except pki.PKIError as e:
        raise JoinError(f"the control plane's join answer is not valid: {e}") from None


def _write_join(pki_dir: Path, info: JoinInfo, key_pem: bytes, answer: wire.JoinResponse) -> None:
    pki_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    pki.write_pem(pki_dir / NODE_KEY, key_pem, private=True)
    pki.write_pem(pki_dir / NODE_CERT, answer.cert_pem.encode())
    pki.write_pem(pki_dir / CA_CERT, answer.ca_pem.encode())
    pki.write_pem(pki_dir / JOIN_FILE, msgspec.json.encode(info) + b"\n")


# The link


class Link:
    """The agent's connection to the control plane; keeps itself up until cancelled."""

    def __init__(
        self,
        server: str,
        pki_dir: Path,
        node: str,
        *,
        version: str,
        inventory: Callable[[], wire.Inventory],
        replicas: Callable[[], Sequence[wire.ReplicaStatus]],
        on_desired: OnDesired,
        address: str | Callable[[], str] = "",
        on_address: OnAddress | None = None,
        heartbeat_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        held: Held | None = None,
        on_sweep: OnSweep | None = None,
        planes: Planes | None = None,
        on_slurm: Callable[[wire.SlurmPart | None], None] | None = None,
        on_upgrade: Callable[[wire.Upgrade], None] | None = None,
    ) -> None:
        self._on_upgrade = on_upgrade  # an Upgrade's packages installed (llmgw upgrade)
        self._upgrades = False  # this connection's control plane takes UpgradeReport
        self._upgrade_report: wire.UpgradeReport | None = None  # the latest, not yet sent
        self._planes = planes if planes is not None else Planes(server)
        self._on_slurm = on_slurm  # the node's part in Slurm from each Desired (no blocking)
        self._pki_dir = pki_dir
        self.node = node
        self._version = version
        self._inventory = inventory
        self._replicas = replicas
        self._on_desired = on_desired
        self._address = address
        self._on_address = on_address
        self._heartbeat_s = heartbeat_s
        self._clock = clock  # wall time: certificates' validity
        self._renew_at = 0.0  # when this node's certificate is due, read at each connection
        self._renewing = False  # a Renew is out on this connection
        self._renews = False  # this connection's control plane takes Renew (its Desired says)
        self._held = held  # the node cache's files (None: this agent reports none)
        self._on_sweep = on_sweep
        self._mirror = False  # this connection's control plane takes Holdings (Desired says)
        self._stopping = False  # it takes the replica state "stopping" (its Desired says)
        self._holdings_due = False  # the cache changed, or a new connection: send Holdings
        self._sweeps: set[asyncio.Task[None]] = set()
        self._send_lock = asyncio.Lock()  # the beat and a sweep's answer send alike
        self._poked = asyncio.Event()
        self._desired: list[wire.ReplicaSpec] | None = None
        self._desired_ready = asyncio.Event()
        self._up = False  # registered and accepted: what "connected"/"lost" logs follow
        self.refused = ""  # why the control plane refuses this node's certificate ("": it does not)
        self._last_problem = ""

    @property
    def _url(self) -> str:
        return f"{self._planes.url}/agent"

    @property
    def server(self) -> str:
        """The control plane dialled now."""
        return self._planes.url

    @property
    def connected(self) -> bool:
        """Whether the control plane has accepted this node's connection."""
        return self._up

    def poke(self) -> None:
        """Replica statuses changed: send a heartbeat now rather than at the next tick."""
        self._poked.set()

    def holdings_changed(self) -> None:
        """The cache's files changed: send Holdings now (where the control plane takes them)."""
        self._holdings_due = True
        self._poked.set()

    async def run(self) -> None:
        """Connect, and reconnect with capped backoff, until cancelled."""
        applier = asyncio.create_task(self._apply_desired())
        timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S)
        delay = MIN_BACKOFF_S
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                while True:
                    outcome = await self._connect_once(session)
                    if outcome in ("lost", "redirect"):
                        delay = MIN_BACKOFF_S
                    elif outcome == "refused":
                        delay = MAX_BACKOFF_S
                    if outcome in ("failed", "lost", "standby"):
                        self._planes.next()  # this one is gone or does not lead: the others
                    # Jitter: a restarted control plane is not hit by every node at once.
                    jitter = random.uniform(1.0, 1.2)  # noqa: S311 (not for secrets)
                    await asyncio.sleep(min(MAX_BACKOFF_S, delay * jitter))
                    delay = min(MAX_BACKOFF_S, delay * 2)
        finally:
            applier.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await applier
            self._up = False

    async def _connect_once(self, session: aiohttp.ClientSession) -> Outcome:
        """One connection, from dialling to its end."""
        try:
            problem = renew.expired(self._pki_dir, self._clock())
            if problem:
                self.refused = problem
                self._lost(problem)
                return "refused"
            ctx = link_ssl_context(self._pki_dir)
            self._renew_at, self._renewing = renew.renew_at(self._pki_dir), False
            self._renews = self._mirror = self._stopping = self._upgrades = False
            self._holdings_due = True  # every new connection hears what the cache holds
            async with session.ws_connect(
                self._url, ssl=ctx, heartbeat=PING_S, max_msg_size=MAX_MESSAGE_BYTES
            ) as ws:
                return await self._converse(ws)
        except (aiohttp.ClientError, OSError, TimeoutError, ssl.SSLError, pki.PKIError) as e:
            self._lost(f"cannot connect to {self._url}: {_describe(e)}")
            return "failed"
        except Exception:
            # A failing callback (inventory, replicas) must not end the link for good.
            log.exception("the link to %s failed", self._url)
            self._up = False
            return "failed"

    async def _converse(self, ws: aiohttp.ClientWebSocketResponse) -> Outcome:
        await self._send(ws, self._register(ws))
        self._poked.clear()  # Register carried the latest statuses
        beats = asyncio.create_task(self._beat(ws))
        try:
            async for frame in ws:
                if frame.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    handled = self._handle(ws, frame.data)
                    if handled != "ok":
                        return handled
                elif frame.type == aiohttp.WSMsgType.ERROR:
                    break
        finally:
            for task in (beats, *self._sweeps):
                task.cancel()
            for task in (beats, *self._sweeps):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        was_up = self._up
        self._lost(f"the control plane closed the connection ({ws.close_code})")
        # Only a connection that was accepted resets the backoff: no tight loop otherwise.
        return "lost" if was_up else "failed"

    def _register(self, ws: aiohttp.ClientWebSocketResponse) -> wire.Register:
        address = self._address() if callable(self._address) else self._address
        if not address:
            address = engine_address(ws.get_extra_info("sockname"), ws.get_extra_info("peername"))
        if self._on_address is not None:
            self._on_address(address)  # before any Desired: engines listen there
        return wire.Register(
            node=self.node,
            address=address,
            version=self._version,
            inventory=self._inventory(),
            replicas=self._statuses(),
            upgrades=self._on_upgrade is not None,
            repository_upgrades=self._on_upgrade is not None,
        )

    def _statuses(self) -> list[wire.ReplicaStatus]:
        """The replicas' states as this control plane reads them: "stopping" is "stopped" to
        one older than that state (it would refuse the message)."""
        out = list(self._replicas())
        if self._stopping:
            return out
        return [msgspec.structs.replace(s, state="stopped") if s.state == "stopping" else s
                for s in out]  # fmt: skip

    def _handle(
        self, ws: aiohttp.ClientWebSocketResponse, data: bytes | str
    ) -> Literal["ok", "refused", "standby", "redirect"]:
        try:
            msg = wire.decode_server(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            log.warning("ignored a message from the control plane that is not valid: %s", e)
            return "ok"
        if isinstance(msg, wire.Refused) and msg.standby:
            return self._not_leader(msg)
        if isinstance(msg, wire.Refused):
            self.refused = msg.reason
            self._lost(f"the control plane refused this node: {msg.reason}")
            return "refused"
        if isinstance(msg, wire.Renewed):
            self._renewed(msg)
            return "ok"
        if isinstance(msg, wire.Sweep):
            self._sweep(ws, msg)
            return "ok"
        if isinstance(msg, wire.Upgrade):
            if self._on_upgrade is not None:
                self._on_upgrade(msg)
            return "ok"
        self._accepted()
        self._renews = msg.renews
        self._upgrades = msg.upgrades
        self._stopping = msg.stopping
        self._planes.update(msg.control_planes)
        if msg.mirror and not self._mirror:
            self._mirror = True
            self._poked.set()  # Holdings follow this first Desired that takes them
        self._desired = list(msg.replicas)
        self._desired_ready.set()
        if self._on_slurm is not None and not msg.slurm_pending:
            self._on_slurm(msg.slurm)  # pending: the control plane knows nothing of it yet
        return "ok"

    def _not_leader(self, msg: wire.Refused) -> Literal["standby", "redirect"]:
        """A standby's answer: dial the leader it names, else the next control plane."""
        here = self._planes.url
        named = f"; the leader is {msg.leader}" if msg.leader else "; no leader is known now"
        self._lost(f"{here} is not the leader{named}")
        if msg.leader and msg.leader.rstrip("/") != here:
            self._planes.follow(msg.leader)
            return "redirect"
        return "standby"

    async def _beat(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """A heartbeat every heartbeat_s, and at once on poke()."""
        while not ws.closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), self._heartbeat_s)
            self._poked.clear()
            try:
                beat = wire.Heartbeat(inventory=self._inventory(), replicas=self._statuses())
            except Exception:
                log.exception("cannot gather this node's state for a heartbeat")
                continue
            try:
                await self._send(ws, beat)
                await self._send_holdings_if_due(ws)
                await self._renew_if_due(ws)
                await self._send_upgrade_report(ws)
            except (ConnectionError, aiohttp.ClientError):
                await ws.close()  # the reader then sees the end
                return
            self._accepted()

    def report_upgrade(self, report: wire.UpgradeReport) -> None:
        """How this node's upgrade goes: sent at once (only the latest counts), to a control
        plane that takes it; a new connection hears it again."""
        self._upgrade_report = report
        self._poked.set()

    async def _send_upgrade_report(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        if self._upgrades and self._upgrade_report is not None:
            await self._send(ws, self._upgrade_report)

    async def _send_holdings_if_due(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """What the cache holds, once this connection's control plane takes it and whenever
        it changed since the last sent (an older control plane would refuse the message)."""
        if self._held is None or not self._mirror or not self._holdings_due:
            return
        self._holdings_due = False
        await self._send(ws, wire.Holdings(files=list(self._held())))

    def _sweep(self, ws: aiohttp.ClientWebSocketResponse, msg: wire.Sweep) -> None:
        """Run a Sweep outside the reader (deleting takes time); answer with Holdings."""
        if self._on_sweep is None or self._held is None:
            log.warning("ignored a sweep from the control plane: this agent keeps no cache")
            return
        task = asyncio.create_task(self._swept(ws, msg, self._on_sweep, self._held))
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)

    async def _swept(
        self, ws: aiohttp.ClientWebSocketResponse, msg: wire.Sweep, on_sweep: OnSweep, held: Held
    ) -> None:
        try:
            await on_sweep(msg)
        except Exception:
            log.exception("sweep %s of this node's cache failed", msg.id)
        try:
            await self._send(ws, wire.Holdings(files=list(held()), sweep=msg.id))
        except (ConnectionError, aiohttp.ClientError):
            await ws.close()  # the reader then sees the end

    async def _renew_if_due(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Ask for the next certificate once this one is due (once a connection), and only
        of a control plane that takes Renew: an older one would refuse the link over it."""
        if not self._renews or self._renewing or self._clock() < self._renew_at:
            return
        try:
            msg = renew.request(self._pki_dir, self.node)
        except pki.PKIError as e:
            log.warning("cannot ask for this node's next certificate: %s", e)
            return
        self._renewing = True
        log.info("this node's certificate is due for renewal; asking the control plane")
        await self._send(ws, msg)

    def _renewed(self, msg: wire.Renewed) -> None:
        """Keep the control plane's new certificate: the next connection presents it."""
        try:
            serial = renew.keep(self._pki_dir, self.node, msg)
            self._renew_at = renew.renew_at(self._pki_dir)
        except pki.PKIError as e:
            log.warning("the control plane's new certificate is not kept: %s", e)
            return
        log.info(
            "this node's certificate renewed (serial %s); used from the next connection", serial
        )

    async def _send(self, ws: aiohttp.ClientWebSocketResponse, msg: wire.AgentMessage) -> None:
        async with self._send_lock:
            await ws.send_bytes(wire.encode(msg))

    async def _apply_desired(self) -> None:
        """Hand the latest Desired to on_desired, one at a time, outside the reader.

        The reader must keep answering pings while engines start; and only the newest
        Desired matters, as each one is the node's full set.
        """
        while True:
            await self._desired_ready.wait()
            self._desired_ready.clear()
            desired, self._desired = self._desired, None
            if desired is None:
                continue
            try:
                await self._on_desired(desired)
            except Exception:
                log.exception("applying the control plane's desired state failed")

    def _accepted(self) -> None:
        if not self._up:
            self._up = True
            self._last_problem = self.refused = ""
            log.info("connected to %s as node %s", self._url, self.node)

    def _lost(self, problem: str) -> None:
        """Log a change of state once, not on every retry."""
        if self._up:
            self._up = False
            log.warning("lost the link to the control plane: %s; reconnecting", problem)
        elif problem != self._last_problem:
            log.warning("%s; retrying", problem)
        else:
            log.debug("%s; retrying", problem)
        self._last_problem = problem


def engine_address(sockname: object, peername: object) -> str:
    """Where this node's engines listen and the control plane reaches them: the local end of
    the link's socket (the node's cluster address), or loopback where the control plane
    runs on this host (the link is over loopback, or from one of the host's addresses to
    itself). "" when the socket does not say."""
    local = _ip(sockname)
    if local is None:
        return ""
    if local.is_loopback or local == _ip(peername):
        return "::1" if local.version == 6 else "127.0.0.1"
    return str(local)


def _ip(name: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A socket name's address, an IPv4-mapped IPv6 one as IPv4 (None: not an IP socket)."""
    if not isinstance(name, tuple) or not name:
        return None
    try:
        ip = ipaddress.ip_address(str(name[0]).partition("%")[0])
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


def _describe(e: BaseException) -> str:
    """A short, stable text for an error (stable, so repeats are recognised as repeats)."""
    if isinstance(e, aiohttp.WSServerHandshakeError):
        return f"HTTP {e.status} {e.message}"
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        return f"its certificate does not fit: {e.certificate_error}"
    if isinstance(e, aiohttp.ClientConnectorError):
        return str(e.os_error) or type(e.os_error).__name__
    return str(e) or type(e).__name__
