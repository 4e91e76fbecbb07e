"""The node certificate's renewal over the link: when it is due, the request, the answer kept."""

from __future__ import annotations

from pathlib import Path

from llmgw import pki, wire

NODE_KEY = "node.key"
NODE_CERT = "node.pem"
CA_CERT = "ca.pem"


def renew_at(pki_dir: Path) -> float:
    """When this node's certificate is due for renewal (unix time)."""
    return pki.renew_at(pki.read_pem(pki_dir / NODE_CERT)).timestamp()


def expired(pki_dir: Path, now: float) -> str:
    """Why this node's certificate cannot be used at now ("": it can)."""
    _, until = pki.validity(pki.read_pem(pki_dir / NODE_CERT))
    if now < until.timestamp():
        return ""
    return (
        f"this node's certificate expired at {until:%Y-%m-%d %H:%M} UTC and the control plane "
        "refuses it: on a control plane, `llmgw node remove` this node, then join it again "
        "with a new token"
    )


def request(pki_dir: Path, node: str) -> wire.Renew:
    """A Renew for this node's own key."""
    csr = pki.node_csr(node, pki.read_pem(pki_dir / NODE_KEY))
    return wire.Renew(csr_pem=csr.decode())


def keep(pki_dir: Path, node: str, msg: wire.Renewed) -> str:
    """Check the new certificate (the cluster CA's, this node's, this key's) and put it in
    place of the old one, atomically; its serial. PKIError if it does not fit."""
    ca_pem = pki.read_pem(pki_dir / CA_CERT)
    pki.check_node_cert(msg.cert_pem, ca_pem, node, pki.read_pem(pki_dir / NODE_KEY))
    pki.write_pem(pki_dir / NODE_CERT, msg.cert_pem.encode())
    return pki.serial_of(msg.cert_pem)
