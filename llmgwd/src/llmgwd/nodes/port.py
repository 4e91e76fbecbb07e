"""The cluster port of llmgwd: its routes (the CA, node joins, the agents' WebSocket, the
mirror's files for nodes), its TLS, and serving it."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
from aiohttp import web

from llmgw import pki, wire
from llmgw.errors import cluster_error
from llmgwd.mirror import node_files
from llmgwd.nodes.agent_session import AgentSessions
from llmgwd.nodes.members import Members
from llmgwd.nodes.state import ClusterState

log = logging.getLogger(__name__)

ConsumeToken = Callable[[str], Awaitable[bool]]

MAX_JOIN_BYTES = 64 << 10


STATE_KEY = web.AppKey("cluster_state", ClusterState)


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
    joins = _Joins(state, ca, consume_token, members)
    agents = AgentSessions(state, ca, members)
    app.router.add_get("/ca", joins.ca)
    app.router.add_post("/join", joins.join)
    app.router.add_get("/agent", agents.agent)
    if files is not None:
        node_files.add_routes(app, files, agents.node_of)

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


class _Joins:
    """The cluster port's handlers for nodes that have no certificate yet: the CA and joins."""

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
            return cluster_error(400, f"not a valid join request: {e}", "invalid_join")
        except web.HTTPRequestEntityTooLarge:
            return cluster_error(413, "join request too large", "too_large")
        try:
            taken = await self._name_taken(req.node)
            if taken:
                # A token must not take over a member's name (and its engines' keys).
                return cluster_error(409, taken, "node_is_member")
            accepted = await self._consume(req.token)
        except Exception as e:
            # No traceback: it could carry the token the store was given.
            log.error("join of node %r: the store failed (%s)", req.node, type(e).__name__)
            return cluster_error(503, "cannot check the join token now; try again", "store_failed")
        if not accepted:
            log.warning(
                "join of node %r from %s refused: invalid, expired or used token",
                req.node,
                request.remote,
            )
            return cluster_error(
                403, "the join token is invalid, expired or already used", "bad_token"
            )
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
            return cluster_error(
                409, f"node {req.node!r} joined at the same time", "node_is_member"
            )
        self._state.allow(req.node)
        log.info("node %s joined from %s", req.node, remote)
        body = wire.JoinResponse(cert_pem=cert.decode(), ca_pem=self._ca.cert_pem.decode())
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")
