"""The agents' sessions on the cluster port: /agent's WebSocket (a node's certificate
admitted, its messages read, its certificate renewed), and the node a request's certificate
names, for the mirror's files."""

from __future__ import annotations

import contextlib
import logging
import ssl

import msgspec
from aiohttp import WSMessage, WSMsgType, web
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from llmgw import compat, package_version, pki, wire
from llmgw.errors import cluster_error
from llmgwd.nodes.agent_conn import AgentConn, not_leader_reason, refuse
from llmgwd.nodes.members import Members, refusal, removed_reason
from llmgwd.nodes.state import ClusterState

log = logging.getLogger(__name__)

PING_S = 10.0  # WebSocket pings: a silent dead peer is dropped within 1.5x this
REGISTER_TIMEOUT_S = 10.0
MAX_MESSAGE_BYTES = 1 << 20


class _Refuse(Exception):
    """End an agent's connection with a Refused message saying why."""


class AgentSessions:
    """The cluster port's handlers for the agents: GET /agent, and node_of for the mirror."""

    def __init__(self, state: ClusterState, ca: pki.CertKey, members: Members) -> None:
        self._state = state
        self._ca = ca
        self._members = members

    async def agent(self, request: web.Request) -> web.StreamResponse:
        """An agent's WebSocket; the node is the client certificate's CN, never the message's."""
        der = _peer_cert(request)
        ident = pki.node_identity(der) if der else None
        if der is None or ident is None:
            return cluster_error(401, "a node certificate signed by the cluster CA is required")
        ws = web.WebSocketResponse(heartbeat=PING_S, max_msg_size=MAX_MESSAGE_BYTES)
        await ws.prepare(request)
        key = _spki(x509.load_der_x509_certificate(der).public_key())
        conn = AgentConn(ident.name, ws, request.remote or "", ident.serial, key)
        if not self._state.leading:
            leader = self._state.leader_url
            await refuse(conn, not_leader_reason(leader), leader)
            return ws
        try:
            await self._admission(ident)
            await self._converse(conn)
        except _Refuse as e:
            log.warning("node %s (%s): connection refused: %s", ident.name, conn.peer, e)
            await refuse(conn, str(e))
        finally:
            self._state._detach(conn)
        return ws

    async def node_of(self, request: web.Request) -> str | web.Response:
        """The node a request's client certificate names, admitted as /agent admits it, or
        the answer that refuses it."""
        der = _peer_cert(request)
        ident = pki.node_identity(der) if der else None
        if ident is None:
            return cluster_error(401, "a node certificate signed by the cluster CA is required")
        try:
            await self._admission(ident)
            if self._state.removed(ident.name):
                raise _Refuse(removed_reason(ident.name))
        except _Refuse as e:
            return cluster_error(403, str(e), "refused")
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

    async def _converse(self, conn: AgentConn) -> None:
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
            elif isinstance(msg, wire.UpgradeReport):
                self._state._upgrade_report(conn, msg)
            else:
                raise _Refuse("register sent twice on one connection")

    async def _renew(self, conn: AgentConn, msg: wire.Renew) -> None:
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
    why = compat.agent_refusal(msg.protocol, msg.version, package_version())
    if why:
        raise _Refuse(why)
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
