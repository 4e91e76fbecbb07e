"""This host's etcd member: its certificates and the config file llmgw-etcd.service runs it with.

A member listens for clients on the host only (https://127.0.0.1:7720: llmgwd is its one
client) and for its peers on the host's advertised address (https://IP:7721), both with
mutual TLS from the cluster CA. Ports 7720/7721 leave a site's own etcd on 2379/2380 alone.

    write_member_config(Path("/etc/llmgw/etcd.yaml"), name="cp1", advertise_ip="10.0.0.1",
                        initial_cluster={"cp1": peer_url("10.0.0.1")}, state="new",
                        state_dir=Path("/var/lib/llmgw"))
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

from llmgw import pki

CONFIG_PATH = Path("/etc/llmgw/etcd.yaml")
CLIENT_PORT = 7720
PEER_PORT = 7721
# What each file of STATE_DIR/pki/ is: the CA's (made by llmgwd), the member's (its peers and
# its client port), and llmgwd's client certificate for its member.
CA_CERT, CA_KEY = "ca.pem", "ca.key"
MEMBER_CERT, MEMBER_KEY = "etcd-member.pem", "etcd-member.key"
CLIENT_CERT, CLIENT_KEY = "etcd-client.pem", "etcd-client.key"
# The CN of every member's certificate, the only one the peer port lets in: the cluster CA
# also signs the agents' node certificates (clientAuth, CN a node name, which has no space),
# and the peer port listens on the host's network address.
PEER_CN = "llmgw etcd member"
ELECTION_MS = 1000  # etcd's default election timeout (heartbeats at a tenth of it)
KEEP_REVISIONS = 10000
MAX_TXN_OPS = 1024
MAX_REQUEST_BYTES = 8 * 1024 * 1024  # history kept for watches, as the SQLite store keeps


def peer_url(ip: str, port: int = PEER_PORT) -> str:
    """A member's peer URL from its address: https://10.0.0.1:7721, https://[fd00::1]:7721."""
    host = f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip
    return f"https://{host}:{port}"


def client_url(port: int = CLIENT_PORT) -> str:
    """A member's client URL: on the host only."""
    return f"https://127.0.0.1:{port}"


def ensure_certs(pki_dir: Path, name: str, advertise_ip: str) -> None:
    """Make the member's and llmgwd's etcd certificates from the cluster CA in pki_dir, unless
    they are there already (the CA must be: llmgwd makes it at its first start, or join
    fetches it). Run as root (the CLI), the files get pki_dir's owner: the member and llmgwd
    run as llmgw and read them."""
    ca = pki.read_pair(pki_dir / CA_CERT, pki_dir / CA_KEY)
    made: list[Path] = []
    if not (pki_dir / MEMBER_CERT).exists():
        member = pki.make_etcd_cert(ca, PEER_CN, [advertise_ip])
        pki.write_pair(member, pki_dir / MEMBER_CERT, pki_dir / MEMBER_KEY)
        made += [pki_dir / MEMBER_CERT, pki_dir / MEMBER_KEY]
    if not (pki_dir / CLIENT_CERT).exists():
        client = pki.make_etcd_cert(ca, f"llmgwd {name}")
        pki.write_pair(client, pki_dir / CLIENT_CERT, pki_dir / CLIENT_KEY)
        made += [pki_dir / CLIENT_CERT, pki_dir / CLIENT_KEY]
    owner = pki_dir.stat()
    if os.geteuid() == 0:
        for path in made:
            os.chown(path, owner.st_uid, owner.st_gid)


def member_config(
    *,
    name: str,
    advertise_ip: str,
    initial_cluster: Mapping[str, str],
    state: Literal["new", "existing"],
    state_dir: Path,
    data_dir: Path | None = None,
    client_port: int = CLIENT_PORT,
    peer_port: int = PEER_PORT,
    election_ms: int = ELECTION_MS,
) -> dict[str, Any]:
    """etcd 3.4's config file for one member, as a dict.

    initial_cluster: every member's name and peer URL (this one's included), e.g.
    {"cp1": peer_url("10.0.0.1")}; state: "new" for the first member of a cluster,
    "existing" for one added to a running cluster (after etcd's member add). etcd's smallest
    lease TTL follows election_ms: 1.5 election timeouts, rounded up to whole seconds.
    """
    if name not in initial_cluster:
        raise ValueError(f"initial_cluster does not name this member, {name!r}")
    d = state_dir / "pki"
    tls = {"trusted-ca-file": str(d / CA_CERT), "client-cert-auth": True}
    member_tls = {"cert-file": str(d / MEMBER_CERT), "key-file": str(d / MEMBER_KEY), **tls}
    peer = peer_url(advertise_ip, peer_port)
    return {
        "name": name,
        "data-dir": str(data_dir or state_dir / "etcd"),
        "listen-client-urls": client_url(client_port),
        "advertise-client-urls": client_url(client_port),
        "listen-peer-urls": peer,
        "initial-advertise-peer-urls": peer,
        "initial-cluster": ",".join(f"{n}={u}" for n, u in initial_cluster.items()),
        "initial-cluster-state": state,
        "initial-cluster-token": "llmgw",
        "client-transport-security": member_tls,
        # Peers: only members' certificates (PEER_CN), never a node's. etcd 3.5+ reads
        # allowed-cn here; 3.4 has no such key and reads PeerTLSInfo's AllowedCN below.
        "peer-transport-security": {**member_tls, "allowed-cn": PEER_CN},
        "PeerTLSInfo": {"AllowedCN": PEER_CN},
        # The JSON gateway llmgwd talks to: on by default on etcd's command line, not in a
        # config file.
        "enable-grpc-gateway": True,
        "election-timeout": election_ms,
        "heartbeat-interval": election_ms // 10,
        # A member back from a partition asks before it campaigns (Raft's pre-vote, off by
        # default in 3.4): without it, the terms it ran up alone depose the members' leader,
        # and the store had no leader for seconds, so llmgw's leader, its lease unrenewed,
        # stepped down (the failover test's link-down fault, when the link came back).
        "pre-vote": True,
        # What the SQLite store takes in one write, near enough: a txn of up to 1024
        # operations (etcd: 128) and 8 MiB (etcd: 1.5 MiB), such as a migration's batches.
        "max-txn-ops": MAX_TXN_OPS,
        "max-request-bytes": MAX_REQUEST_BYTES,
        "auto-compaction-mode": "revision",
        "auto-compaction-retention": str(KEEP_REVISIONS),
        "enable-v2": False,
        "logger": "zap",
        "log-outputs": ["stderr"],
    }


def write_member_config(
    path: Path,
    *,
    name: str,
    advertise_ip: str,
    initial_cluster: Mapping[str, str],
    state: Literal["new", "existing"],
    state_dir: Path,
    data_dir: Path | None = None,
    client_port: int = CLIENT_PORT,
    peer_port: int = PEER_PORT,
    election_ms: int = ELECTION_MS,
) -> None:
    """Write member_config(...) to path (CONFIG_PATH for the unit; 0644: it holds no secret,
    only paths, and the member reads it as user llmgw; replaced atomically)."""
    config = member_config(
        name=name,
        advertise_ip=advertise_ip,
        initial_cluster=initial_cluster,
        state=state,
        state_dir=state_dir,
        data_dir=data_dir,
        client_port=client_port,
        peer_port=peer_port,
        election_ms=election_ms,
    )
    text = "# Written by llmgw (llmgwd.planes.etcd_member); read by llmgw-etcd.service.\n"
    text += yaml.safe_dump(config, sort_keys=False)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
