"""Real etcd members on loopback for tests and bench/store: free ports, a temp dir, TLS from a
fresh cluster CA, each started from the config file llmgwd.planes.etcd_member writes."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from llmgw import pki
from llmgwd.planes import etcd_member

ETCD = Path("/usr/bin/etcd")
READY_S = 30.0


@dataclass
class Member:
    """One running member: its client URL and the files its clients need."""

    name: str
    endpoint: str
    pki_dir: Path
    proc: subprocess.Popen[bytes]

    @property
    def ca_file(self) -> Path:
        return self.pki_dir / etcd_member.CA_CERT

    @property
    def cert_file(self) -> Path:
        return self.pki_dir / etcd_member.CLIENT_CERT

    @property
    def key_file(self) -> Path:
        return self.pki_dir / etcd_member.CLIENT_KEY


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _healthy(member: Member) -> bool:
    ctx = pki.client_context(member.ca_file.read_bytes(), member.cert_file, member.key_file)
    host, port = member.endpoint.removeprefix("https://").split(":")
    conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=2)
    try:
        conn.request("GET", "/health")
        return bool(json.loads(conn.getresponse().read()).get("health") == "true")
    except (OSError, ValueError):
        return False
    finally:
        conn.close()


def _wait_ready(members: list[Member]) -> None:
    until = time.monotonic() + READY_S
    for m in members:
        while not _healthy(m):
            if m.proc.poll() is not None:
                raise RuntimeError(f"etcd {m.name} exited {m.proc.returncode}")
            if time.monotonic() > until:
                raise RuntimeError(f"etcd {m.name} not healthy within {READY_S} s")
            time.sleep(0.05)


@contextlib.contextmanager
def cluster(root: Path, size: int = 1, *, election_ms: int = 500) -> Iterator[list[Member]]:
    """Start size members under root (one state dir each, sharing one CA); stop them after."""
    ca = pki.make_ca("test")
    ports = _free_ports(2 * size)
    names = [f"m{i}" for i in range(size)]
    peers = {n: etcd_member.peer_url("127.0.0.1", ports[2 * i + 1]) for i, n in enumerate(names)}
    members: list[Member] = []
    try:
        for i, name in enumerate(names):
            members.append(_start(root / name, ca, name, peers, ports[2 * i], election_ms))
        _wait_ready(members)
        yield members
    finally:
        for m in members:
            m.proc.terminate()
        for m in members:
            try:
                m.proc.wait(10)
            except subprocess.TimeoutExpired:
                m.proc.kill()
                m.proc.wait()


def _start(
    state_dir: Path,
    ca: pki.CertKey,
    name: str,
    peers: dict[str, str],
    client_port: int,
    election_ms: int,
) -> Member:
    pki_dir = state_dir / "pki"
    pki.write_pair(ca, pki_dir / etcd_member.CA_CERT, pki_dir / etcd_member.CA_KEY)
    etcd_member.ensure_certs(pki_dir, name, "127.0.0.1")
    config = state_dir / "etcd.yaml"
    etcd_member.write_member_config(
        config,
        name=name,
        advertise_ip="127.0.0.1",
        initial_cluster=peers,
        state="new",
        state_dir=state_dir,
        client_port=client_port,
        peer_port=int(peers[name].rsplit(":", 1)[1]),
        election_ms=election_ms,  # 500 ms: etcd's smallest lease TTL is then 1 s
    )
    argv = [str(ETCD), "--config-file", str(config)]
    log = (state_dir / "etcd.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    return Member(name, etcd_member.client_url(client_port), pki_dir, proc)
