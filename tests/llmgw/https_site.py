"""/api/v1 over HTTPS for the CLI's tests: a TLS site whose certificate a CA of llmgw.pki
signs, guarded by keys as the client port is, and a context of the CLI pinned to it."""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from click.testing import CliRunner

from llmgw import pki
from llmgw.cli.main import main
from llmgwd.api.base import KeyLookup
from llmgwd.catalog import ApiKey

ADMIN_SECRET = "sk-llmgw-test-admin-over-https"


class WithAdmin:
    """The catalog's keys, and one admin key kept outside it (so listings stay the same
    over either transport)."""

    def __init__(self, keys: KeyLookup) -> None:
        self.keys = keys
        self.admin = ApiKey(id="adm1", name="test-admin", hash="", prefix="sk-llmgw-test",
                            role="admin", created_at=time.time())  # fmt: skip

    def authenticate(self, secret: str) -> ApiKey | None:
        """The admin key for ADMIN_SECRET, else the catalog's."""
        return self.admin if secret == ADMIN_SECRET else self.keys.authenticate(secret)


@dataclass(frozen=True)
class Tls:
    """A CA and the server context of a certificate it signed for 127.0.0.1."""

    ca: pki.CertKey
    server: ssl.SSLContext

    @property
    def fingerprint(self) -> str:
        return pki.ca_fingerprint(self.ca.cert_pem)


def make_tls(tmp_path: Path) -> Tls:
    """A new CA and a server context presenting its certificate and the CA (its chain)."""
    ca = pki.make_ca("test")
    leaf = pki.make_server_cert(ca)
    chain, key = tmp_path / "server-chain.pem", tmp_path / "server.key"
    chain.write_bytes(leaf.cert_pem + ca.cert_pem)
    key.write_bytes(leaf.key_pem)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(chain, key)
    return Tls(ca, server)


async def start_tls_site(
    app: web.Application, tls: ssl.SSLContext, host: str = "127.0.0.1"
) -> tuple[web.AppRunner, str]:
    """Serve app on host (a free port) with TLS; the runner and https://HOST:PORT."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0, ssl_context=tls)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"https://{host}:{port}"


def add_context(config_home: Path, name: str, url: str, *options: str) -> None:
    """`llmgw context add NAME URL OPTIONS...` in config_home, which must succeed."""
    env = {"XDG_CONFIG_HOME": str(config_home)}
    r = CliRunner().invoke(main, ["context", "add", name, url, *options], env=env)
    assert r.exit_code == 0, r.output
