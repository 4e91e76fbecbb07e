"""The cluster port's POST /servers/join: a new control plane trades a one-time plane token
for the CA and its key, the cluster secret and its place among the store's etcd members.

It answers only a live plane token: no token, a node token, a used or an expired one are all
the same 403, which says nothing of the cluster; a name already a member, or another control
plane still joining (etcd takes one learner at a time), is a 409 that keeps the token (checked
after the token, so only its holder learns the names), and etcd refusing the member for now
(a member connected for under 5 s: "unhealthy cluster") a 503 that keeps it too: the token
is spent only after the member is added. The new member is added as a learner:
it counts toward no quorum until promotion.Promoter finds it caught up.
"""

from __future__ import annotations

import base64
import logging
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import msgspec
from aiohttp import web

from llmgw import pki, wire
from llmgw.errors import cluster_error
from llmgwd.planes.listing import EtcdCluster, Member
from llmgwd.planes.tokens import PlaneTokens
from llmgwd.store.etcd_http import EtcdError

log = logging.getLogger(__name__)

PATH = "/servers/join"
_URL = re.compile(r"https://[A-Za-z0-9.:\[\]-]+:[0-9]{1,5}")


@dataclass(frozen=True, slots=True)
class Joining:
    """What the route hands out, and where it records the new member."""

    tokens: PlaneTokens
    etcd: EtcdCluster | None  # None: the store is SQLite, nobody can join
    ca: pki.CertKey
    secret: bytes
    cluster: str

    async def handle(self, request: web.Request) -> web.Response:
        """POST /servers/join {token, name, peer_url}."""
        try:
            req = msgspec.json.decode(await request.read(), type=wire.PlaneJoinRequest)
            pki.check_node_name(req.name)
            if req.name in ("tokens", "leave"):  # /api/v1/planes/{name} could not reach it
                raise ValueError(f"a control plane cannot be named {req.name!r}")
            if not _URL.fullmatch(req.peer_url) or urlsplit(req.peer_url).port is None:
                raise ValueError("peer_url must be https://ADDRESS:PORT")
        except web.HTTPRequestEntityTooLarge:
            return _error(413, "request too large", "too_large")
        except (msgspec.ValidationError, msgspec.DecodeError, pki.PKIError, ValueError) as e:
            return _error(
                400, f"not a valid control plane join request: {_said(e)}", "invalid_join"
            )
        try:
            return await self._admit(req, request.remote or "")
        except Exception as e:
            # No traceback: it could carry what the store was given.
            log.error("join of control plane %r failed: %s", req.name, type(e).__name__)
            return _error(503, "cannot add the control plane now; try again", "store_failed")

    async def _admit(self, req: wire.PlaneJoinRequest, remote: str) -> web.Response:
        if not await self.tokens.valid(req.token):
            log.warning("control plane join from %s refused: not a live plane token", remote)
            return _error(403, "the plane token is invalid, expired or already used", "bad_token")
        if self.etcd is None:
            why = "this cluster's store is SQLite: run `llmgw plane migrate --to etcd` here first"
            return _error(409, why, "no_etcd")
        members = await self.etcd.members()
        for m in members:
            if m.name == req.name or req.peer_url in m.peer_urls:
                why = f"{req.name!r} or {req.peer_url} is already a member of the store's cluster"
                return _error(409, why, "server_is_member")
        if any(m.learner for m in members):
            # etcd takes one learner at a time: the next joins once that one is promoted.
            why = "another control plane is joining (its etcd member is not promoted yet): retry"
            return _error(409, why, "server_joining")
        try:
            after = await self.etcd.add(req.peer_url)
        except EtcdError as e:  # etcd's own words: no key, no value, no token
            log.warning("control plane %s cannot be added now: %s", req.name, e.message)
            why = f"the store's cluster cannot add a member now ({e.message}); try again"
            return _error(503, why, "store_not_ready")
        if not await self.tokens.consume(req.token):  # spent meanwhile: the member goes again
            await self._undo(after, req.peer_url)
            return _error(403, "the plane token is invalid, expired or already used", "bad_token")
        log.warning("control plane %s joining from %s (etcd peer %s)", req.name, remote,
                    req.peer_url)  # fmt: skip
        answer = wire.PlaneJoinResponse(
            ca_pem=self.ca.cert_pem.decode(),
            ca_key_pem=self.ca.key_pem.decode(),
            secret=base64.b64encode(self.secret).decode(),
            members=[_named(m, req) for m in after],
            cluster=self.cluster,
        )
        return web.Response(body=msgspec.json.encode(answer), content_type="application/json")

    async def _undo(self, after: list[Member], peer_url: str) -> None:
        if self.etcd is not None:
            for m in after:
                if not m.name and peer_url in m.peer_urls:
                    await self.etcd.remove(m.id)


def _named(m: Member, req: wire.PlaneJoinRequest) -> wire.EtcdMember:
    """A member as the new host writes it in etcd's initial cluster: itself under its name."""
    mine = not m.name and req.peer_url in m.peer_urls
    return wire.EtcdMember(req.name if mine else m.name, m.peer_urls)


def add_route(app: web.Application, joining: Joining) -> None:
    """Serve POST /servers/join on the cluster port's application."""
    app.router.add_post(PATH, joining.handle)


def _said(e: Exception) -> str:
    """What was wrong with a request, never quoting its token."""
    return "" if isinstance(e, msgspec.DecodeError) else str(e).split(" - at ")[0]


def _error(status: int, message: str, code: str) -> web.Response:
    return cluster_error(status, message, code)
