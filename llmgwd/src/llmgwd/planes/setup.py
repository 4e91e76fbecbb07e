"""What llmgwd runs for its control planes: plane tokens, the store's etcd cluster (none on
SQLite), /api/v1/planes' context, the cluster port's POST /servers/join and the promoter."""

from __future__ import annotations

import ssl
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from llmgw import pki
from llmgw.config import ServerConfig
from llmgwd.planes import backup, etcd_member, join
from llmgwd.planes.etcd_cluster import EtcdCluster
from llmgwd.planes.join import Joining
from llmgwd.planes.listing import ControlPlanes
from llmgwd.planes.promotion import Promoter
from llmgwd.planes.tokens import PlaneTokens
from llmgwd.store import Store
from llmgwd.store.etcd_http import EtcdHttp, tls_context


@dataclass(frozen=True, slots=True)
class PlaneParts:
    """The control planes' parts of one llmgwd."""

    planes: ControlPlanes  # api.ApiContext.control_planes
    joining: Joining
    promoter: Promoter | None  # None on SQLite
    client: EtcdHttp | None  # membership's own connection to this host's member

    def add_route(self, app: web.Application) -> None:
        """POST /servers/join on the cluster port's application (before it serves)."""
        join.add_route(app, self.joining)

    def tasks(self) -> list[Coroutine[Any, Any, None]]:
        """What runs for as long as llmgwd does: the promotion of joined members."""
        return [self.promoter.run()] if self.promoter is not None else []

    async def close(self) -> None:
        """Close the connection to the member."""
        if self.client is not None:
            await self.client.close()


def member_tls(cfg: ServerConfig, state_dir: Path) -> ssl.SSLContext:
    """TLS to this host's member with llmgwd's client certificate (the files the `store:`
    section names, as store.open reads them)."""
    s, d = cfg.store, state_dir / "pki"
    return tls_context(
        Path(s.ca_file) if s.ca_file else d / etcd_member.CA_CERT,
        Path(s.cert_file) if s.cert_file else d / etcd_member.CLIENT_CERT,
        Path(s.key_file) if s.key_file else d / etcd_member.CLIENT_KEY,
    )


def build(
    cfg: ServerConfig, store: Store, ca: pki.CertKey, secret: bytes, *, name: str, url: str
) -> PlaneParts:
    """The parts for this llmgwd: name is its control plane's name (daemon.server_name),
    url its cluster port's advertised URL."""
    tokens = PlaneTokens(store, ca.cert_pem)
    client, etcd = None, None
    if cfg.store.backend == "etcd":
        tls = member_tls(cfg, Path(cfg.state_dir))
        client = EtcdHttp(cfg.store.endpoint, tls)
        etcd = EtcdCluster(client, tls)
    source = backup.Source(store, cfg, ca, secret, name)
    planes = ControlPlanes(store=store, etcd=etcd, tokens=tokens, me=name, join_url=url,
                           backup=source)  # fmt: skip
    joining = Joining(tokens, etcd, ca, secret, cfg.name)
    return PlaneParts(planes, joining, Promoter(etcd) if etcd else None, client)
