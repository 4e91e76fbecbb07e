"""llmgwd with `mode: mirror`: the model mirror on a machine of its own, for a site whose GPU
network has no way out. It runs the store, the catalog (keys, people, models to fetch), the
mirror with /hf, /api/v1, sign-in and SCIM on the client port and the local socket; no
scheduler, reconciler, router, cluster port or Slurm. /v1 answers that it is a mirror only.
Other clusters use it as their mirror.upstream or as a peer (`llmgw mirror add-peer`)."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmgw import localsock, pki, sdnotify
from llmgw.config import ServerConfig
from llmgw.errors import ApiError
from llmgwd import daemon
from llmgwd.accounting.levels import Levels
from llmgwd.api import login
from llmgwd.api.access import key_auth, peercred_auth
from llmgwd.api.base import API_PREFIX, ApiContext, NodeInfo
from llmgwd.api.routes import api_subapp
from llmgwd.catalog import Catalog
from llmgwd.clientport import listener
from llmgwd.daemon import Daemon, Pki, advertise_url, load_pki, split_listen
from llmgwd.mirror import setup as mirror_setup
from llmgwd.router.metering import Meter
from llmgwd.scim import app as scim
from llmgwd.scim.base import ScimContext
from llmgwd.store.open import open_store

log = logging.getLogger("llmgwd")

MODE = "mirror"


def mirror_only(name: str) -> ApiError:
    """What /v1 answers here: 404 (a client does not retry it) saying where models are."""
    return ApiError(
        404,
        f"{name} is a model mirror only (server.yaml's mode: mirror): it serves no model. "
        "Send /v1 requests to a cluster's control plane; this machine's models are at /hf "
        "for huggingface_hub and for other clusters' mirrors.",
        "invalid_request_error",
        "mirror_only",
    )


def v1_app(name: str) -> web.Application:
    """/v1: every path and method answers mirror_only, in OpenAI's error shape."""

    async def refuse(_request: web.Request) -> web.StreamResponse:
        return mirror_only(name).response()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    return app


# What would place a replica: a mirror alone runs none, and says so rather than store it.
PLACING = re.compile(r"^/api/v1/models/[^/]+/(serve|replicas|restart)$")


@web.middleware
async def nothing_placed(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse serving a model here (409 mirror_only); anything else goes on."""
    if request.method == "POST" and PLACING.match(request.path):
        raise ApiError(
            409, "this llmgwd is a model mirror only (mode: mirror): it runs no model; serve "
            "it on a cluster's control plane, whose mirror fetches it from here",
            "invalid_request_error", "mirror_only",
        )  # fmt: skip
    return await handler(request)


def api(ctx: ApiContext, auth: Middleware) -> web.Application:
    """/api/v1, guarded by auth, with serving refused."""
    app = api_subapp(ctx, auth)
    app.middlewares.append(nothing_placed)  # after auth: a caller with no right gets 401/403
    return app


def hf_url(config: ServerConfig) -> str:
    """This machine's /hf as other machines reach it: the client port's listen address (its
    FQDN when that is a wildcard)."""
    host, port = split_listen(config.client.listen)
    host = socket.getfqdn() if host in ("0.0.0.0", "::") else host
    return f"https://[{host}]:{port}/hf" if ":" in host else f"https://{host}:{port}/hf"


def as_peer(config: ServerConfig) -> str:
    """What `llmgw mirror add-peer` here says a control plane's operator runs to copy from
    this machine: add-peer there, or server.yaml's mirror.upstream; its key; its CA."""
    url = hf_url(config)
    ca = "" if config.client.tls_cert else (
        f"; and mirror.ca_file: a copy of {config.state_dir}/pki/ca.pem, this machine's CA"
    )  # fmt: skip
    return (
        "This llmgwd is a mirror alone. A control plane copies from it with\n"
        f"  llmgw mirror add-peer {url} --token-file FILE\n"
        f"or fetches through it with server.yaml's mirror.upstream: {url} and "
        "mirror.token_file: FILE\n"
        f"(FILE: a key made here, llmgw key create NAME --admin{ca})."
    )


class NoNodes:
    """A mirror alone has no nodes."""

    def nodes(self) -> list[NodeInfo]:
        return []


def no_join_token() -> str:
    """Nodes join a cluster's control plane, never a mirror alone."""
    raise ApiError(
        409, "this llmgwd is a model mirror only (mode: mirror): nodes join a cluster's "
        "control plane", "invalid_request_error", "mirror_only",
    )  # fmt: skip


class MirrorOnly(Daemon):
    """llmgwd as a mirror alone: started in order and stopped in reverse."""

    async def start(self) -> None:
        """Open the store and the mirror, bring up the client port and the socket."""
        cfg = self.config
        state_dir = Path(cfg.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (start-up, once)
        sdnotify.status("opening the store")
        keys = load_pki(state_dir, advertise_url(cfg))  # the CA of the client port's own cert
        self.store = await open_store(cfg, state_dir)
        self.levels = Levels()
        self.catalog = Catalog(self.store, followers=(self.levels,))
        revision = await self.catalog.load()
        self.mirror = await mirror_setup.start(cfg, state_dir, self.store, self.catalog)
        self._spawn(self.catalog.follow(revision))
        self._spawn(sdnotify.watchdog())
        ctx = ApiContext(
            catalog=self.catalog,
            nodes=NoNodes(),
            mint_token=no_join_token,
            join_url="",
            ca_fingerprint=pki.ca_fingerprint(keys.ca.cert_pem),
            name=cfg.name,
            mode=MODE,
            as_peer=as_peer(cfg),
            mirror=self.mirror,
        )
        await self._serve_mirror_client(ctx, keys)
        await self._serve_mirror_local(ctx)
        sdnotify.ready(f"a mirror alone, serving /hf on {cfg.client.listen}")
        log.info("llmgwd serving as a mirror alone: client port %s, socket %s",
                 cfg.client.listen, cfg.socket)  # fmt: skip

    async def _serve_mirror_client(self, ctx: ApiContext, keys: Pki) -> None:
        """The client port: /hf, /api/v1, sign-in and SCIM; /v1 refused."""
        cfg = self.config
        app = web.Application(client_max_size=cfg.client.max_body_bytes)
        app.add_subapp("/v1", v1_app(cfg.name))
        route = cfg.network.route(os.environ)
        after = self._ldap_groups()
        app.add_subapp(login.PREFIX, login.login_app(self.catalog, cfg.oidc, route, after))
        app.add_subapp(API_PREFIX, api(ctx, key_auth(self.catalog)))
        allows = Meter(levels=self.levels).allows  # a key sees the sets of its models
        app.add_subapp("/hf", mirror_setup.hub(self.mirror, self.catalog, allows))
        app.add_subapp(scim.PREFIX, scim.scim_app(ScimContext(self.catalog, cfg.oidc.rules)))
        host, port = split_listen(cfg.client.listen)
        own_tls = self._own_tls(keys)  # None: the site's certificate (client.tls_cert)
        self.client_runner = await listener.serve(app, cfg.client, host, port, own_tls)
        self._runners.append(self.client_runner)

    def _leads(self) -> bool:
        """A mirror alone is the only one of its kind: it reads the LDAP directory itself."""
        return True

    async def _serve_mirror_local(self, ctx: ApiContext) -> None:
        """/api/v1 on the local socket, its peers' credentials the authentication."""
        path = Path(self.config.socket)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # noqa: ASYNC240 (a socket left by a killed llmgwd)
        app = web.Application()
        app.add_subapp(API_PREFIX, api(ctx, peercred_auth(self.config.socket_group)))
        runner = web.AppRunner(app)
        await runner.setup()
        await web.UnixSite(runner, str(path)).start()
        localsock.secure_socket(str(path), self.config.socket_group)
        self._runners.append(runner)

    async def stop(self) -> None:
        """Stop serving, then close the mirror and the store."""
        sdnotify.stopping()
        for runner in reversed(self._runners):
            await runner.cleanup()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.mirror.close()
        await self.store.close()
        log.info("llmgwd (a mirror alone) stopped")


def make(config: ServerConfig) -> Daemon:
    """The daemon server.yaml's mode asks for."""
    return MirrorOnly(config) if config.mode == MODE else Daemon(config)


async def run(config: ServerConfig) -> None:
    """Run llmgwd in server.yaml's mode until SIGTERM or SIGINT."""
    await daemon.run(config, make)
