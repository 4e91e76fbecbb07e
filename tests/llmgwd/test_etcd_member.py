"""etcd_member: the member's config (host-only clients, TLS peers on 7721) and certificates."""

from __future__ import annotations

import http.client
import os
import ssl
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from llmgw import pki
from llmgwd.planes import etcd_member
from tests.llmgwd.store import local_etcd


def test_the_config_listens_for_clients_on_the_host_only_and_peers_with_tls(
    tmp_path: Path,
) -> None:
    path = tmp_path / "etcd.yaml"
    peers = {"cp1": etcd_member.peer_url("10.0.0.1"), "cp2": etcd_member.peer_url("fd00::2")}
    etcd_member.write_member_config(
        path,
        name="cp1",
        advertise_ip="10.0.0.1",
        initial_cluster=peers,
        state="existing",
        state_dir=Path("/var/lib/llmgw"),
    )
    config = yaml.safe_load(path.read_text())
    assert config["listen-client-urls"] == "https://127.0.0.1:7720"
    assert config["listen-peer-urls"] == "https://10.0.0.1:7721"
    assert config["initial-cluster"] == "cp1=https://10.0.0.1:7721,cp2=https://[fd00::2]:7721"
    assert config["initial-cluster-state"] == "existing"
    assert config["data-dir"] == "/var/lib/llmgw/etcd"
    assert config["enable-grpc-gateway"] is True
    assert config["pre-vote"] is True  # a member back from a partition deposes no leader
    for side in ("client-transport-security", "peer-transport-security"):
        assert config[side] == {
            "cert-file": "/var/lib/llmgw/pki/etcd-member.pem",
            "key-file": "/var/lib/llmgw/pki/etcd-member.key",
            "trusted-ca-file": "/var/lib/llmgw/pki/ca.pem",
            "client-cert-auth": True,
            **({"allowed-cn": etcd_member.PEER_CN} if side.startswith("peer") else {}),
        }
    assert config["PeerTLSInfo"] == {"AllowedCN": etcd_member.PEER_CN}
    assert path.stat().st_mode & 0o777 == 0o644


def test_a_config_whose_cluster_omits_the_member_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cp9"):
        etcd_member.member_config(
            name="cp9",
            advertise_ip="10.0.0.9",
            initial_cluster={"cp1": etcd_member.peer_url("10.0.0.1")},
            state="new",
            state_dir=tmp_path,
        )


def test_certificates_serve_and_dial_and_belong_to_the_pki_dirs_owner(tmp_path: Path) -> None:
    d = tmp_path / "pki"
    pki.write_pair(pki.make_ca(), d / etcd_member.CA_CERT, d / etcd_member.CA_KEY)
    if os.geteuid() == 0:
        os.chown(d, 65534, 65534)  # as llmgw's pki dir, written by root (join, migrate)
    etcd_member.ensure_certs(d, "cp1", "10.0.0.1")
    cert = x509.load_pem_x509_certificate((d / etcd_member.MEMBER_CERT).read_bytes())
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {
        "127.0.0.1",
        "10.0.0.1",
    }
    for name in ("etcd-member.pem", "etcd-member.key", "etcd-client.pem", "etcd-client.key"):
        st = (d / name).stat()
        assert (st.st_uid, st.st_gid) == (d.stat().st_uid, d.stat().st_gid), name
    assert (d / etcd_member.CLIENT_KEY).stat().st_mode & 0o777 == 0o600
    before = (d / etcd_member.MEMBER_CERT).read_bytes()
    etcd_member.ensure_certs(d, "cp1", "10.0.0.1")
    assert (d / etcd_member.MEMBER_CERT).read_bytes() == before  # kept, not made again


def _peer_members(port: int, ca_pem: bytes, cert: Path, key: Path) -> int:
    """The status of GET /members on a member's peer port, presenting cert."""
    conn = http.client.HTTPSConnection(
        "127.0.0.1", port, context=pki.client_context(ca_pem, cert, key), timeout=5
    )
    try:
        conn.request("GET", "/members")
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.skipif(not local_etcd.ETCD.exists(), reason="etcd is not installed")
def test_the_peer_port_refuses_a_nodes_certificate(tmp_path: Path) -> None:
    """Agents' node certificates come from the same CA (clientAuth): on the peer port, which
    listens on the host's network address, one would let any node host speak Raft to the
    member (forge appends, write any key). Only the members' own certificates are let in."""
    with local_etcd.cluster(tmp_path, 2) as (m0, _m1):  # two: the peers still reach each other
        config = yaml.safe_load((tmp_path / m0.name / "etcd.yaml").read_text())
        port = int(config["listen-peer-urls"].rsplit(":", 1)[1])
        ca = pki.read_pair(m0.ca_file, m0.pki_dir / etcd_member.CA_KEY)
        key_pem, csr = pki.make_node_csr("gpu1")
        (tmp_path / "node.pem").write_bytes(pki.sign_csr(ca, csr, "gpu1"))
        (tmp_path / "node.key").write_bytes(key_pem)
        member = (m0.pki_dir / etcd_member.MEMBER_CERT, m0.pki_dir / etcd_member.MEMBER_KEY)
        assert _peer_members(port, ca.cert_pem, *member) == 200
        with pytest.raises(ssl.SSLError):
            _peer_members(port, ca.cert_pem, tmp_path / "node.pem", tmp_path / "node.key")
