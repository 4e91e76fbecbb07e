"""`systemctl reload llmgwd` (SIGHUP): server.yaml and the client port's certificate read
again; what can change live is applied, what needs a restart is named in the log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec

from llmgw import sdnotify
from llmgw.config import ConfigError, ServerConfig
from llmgwd.clientport import tls
from llmgwd.clientport.listener import ClientServer

log = logging.getLogger("llmgwd.clientport.reload")

# What a reload changes in a running llmgwd; any other setting changed is named in the log
# as waiting for a restart. The certificate and key files are read again even when their
# paths are the same (an ACME client renews them in place).
LIVE = (
    "client.tls_cert",
    "client.tls_key",
    "client.max_connections_per_address",
    "log_level",
)


def changed(before: ServerConfig, after: ServerConfig) -> list[str]:
    """The dotted names of the settings whose values differ."""
    return _diff(msgspec.to_builtins(before), msgspec.to_builtins(after), "")


def _diff(a: Any, b: Any, prefix: str) -> list[str]:
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [] if a == b else [prefix]
    names = sorted(set(a) | set(b))
    return [
        n
        for k in names
        for n in _diff(a.get(k), b.get(k), f"{prefix}{k}" if not prefix else f"{prefix}.{k}")
    ]


def reload(server: ClientServer, started: ServerConfig, read: Callable[[], ServerConfig]) -> bool:
    """Read the settings again and apply the live ones to the running client port (started:
    the settings llmgwd started with, so a setting that needs a restart is named at every
    reload until then). New TLS handshakes get the new certificate; connections open keep
    the one they have. False when the settings or the certificate could not be used: what
    was in force is kept. systemd hears RELOADING=1, then READY=1."""
    sdnotify.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
    try:
        try:
            new = read()
        except ConfigError as e:
            log.warning("not reloaded, the settings in force are kept: %s", e)
            return False
        return _apply(server, started, new)
    finally:
        where = f"serving /v1 on {started.client.listen}, agents on {started.cluster.listen}"
        sdnotify.notify("READY=1", f"STATUS={where}")


def _apply(server: ClientServer, started: ServerConfig, new: ServerConfig) -> bool:
    ok = _swap_certificate(server, started, new)
    server.gate.cap = new.client.max_connections_per_address
    logging.getLogger().setLevel(new.log_level.upper())
    waiting = [k for k in changed(started, new) if k not in LIVE]
    if waiting:
        log.warning("reloaded; changed but in force only after a restart: %s", ", ".join(waiting))
    else:
        log.info("reloaded")
    return ok


def _swap_certificate(server: ClientServer, started: ServerConfig, new: ServerConfig) -> bool:
    """Each connection's TLS layer takes the server's context at its accept, so replacing it
    changes the certificate of new handshakes only; False when the new one cannot be used."""
    had, has = bool(started.client.tls_cert), bool(new.client.tls_cert)
    if had != has:
        log.warning("client port: a certificate added or removed: in force after a restart")
    if not (had and has):
        return True
    context = tls.reloaded(new.client)
    if context is None:
        return False
    server.tls = context
    return True
