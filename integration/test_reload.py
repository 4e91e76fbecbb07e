"""`systemctl reload llmgwd` in a booted systemd: the client port's certificate, renewed in
place as an ACME client does, is what a new TLS client sees, while a keep-alive connection
opened before goes on answering and llmgwd's process stays the same."""

from __future__ import annotations

import http.client
import ssl
import time
from collections.abc import Iterator

import pytest
from cryptography import x509

from integration.harness import PrivateSystemd
from integration.llmgw_node import Node
from llmgw import pki

CLIENT_PORT, CLUSTER_PORT = 17960, 17970  # apart from the other integration tests' ports
CERT, KEY = "/etc/llmgw/client.crt", "/etc/llmgw/client.key"


def put_pair(ps: PrivateSystemd, pair: pki.CertKey) -> str:
    """The certificate and key written over the files (llmgwd's group may read): its serial."""
    ps.write_file(CERT, pair.cert_pem.decode())
    ps.write_file(KEY, pair.key_pem.decode(), mode=0o640)
    ps.run(["chgrp", "llmgw", CERT, KEY])
    return pki.serial_of(pair.cert_pem)


def connect(trust: ssl.SSLContext) -> tuple[http.client.HTTPSConnection, str]:
    """A kept-alive HTTPS connection to the client port and its certificate's serial."""
    conn = http.client.HTTPSConnection("127.0.0.1", CLIENT_PORT, context=trust, timeout=10)
    conn.connect()
    sock = conn.sock
    assert isinstance(sock, ssl.SSLSocket)
    der = sock.getpeercert(binary_form=True)
    assert der is not None
    return conn, format(x509.load_der_x509_certificate(der).serial_number, "x")


def ask(conn: http.client.HTTPSConnection) -> int:
    """GET /v1/models on conn (no key: 401), the connection kept."""
    conn.request("GET", "/v1/models")
    answer = conn.getresponse()
    answer.read()
    return answer.status


@pytest.fixture(scope="module")
def node(systemd: PrivateSystemd) -> Iterator[Node]:
    """llmgwd alone, its client port on the site's certificate."""
    n = Node(systemd, CLIENT_PORT, CLUSTER_PORT)
    n.install("/bin/true")  # no engine runs here
    n.llmgw("plane", "init", "--no-start", "--advertise", f"https://127.0.0.1:{CLUSTER_PORT}")
    text = systemd.read_file("/etc/llmgw/server.yaml")
    text = text.replace("0.0.0.0:7700", f"127.0.0.1:{CLIENT_PORT}")
    text = text.replace("0.0.0.0:7710", f"127.0.0.1:{CLUSTER_PORT}")
    text = text.replace("tls_cert: ''", f"tls_cert: {CERT}").replace(
        "tls_key: ''", f"tls_key: {KEY}"
    )
    systemd.write_file("/etc/llmgw/server.yaml", text)
    yield n
    systemd.systemctl("stop", "llmgwd.service", check=False)


def test_reload_swaps_the_certificate_without_dropping_a_connection(
    node: Node, systemd: PrivateSystemd
) -> None:
    ca = pki.make_ca()
    old = put_pair(systemd, pki.make_server_cert(ca))
    systemd.systemctl("enable", "--now", "llmgwd.service")
    systemd.wait_active("llmgwd.service", timeout=60)
    trust = ssl.create_default_context(cadata=ca.cert_pem.decode())
    pid = node.main_pid("llmgwd.service")
    before, serial = connect(trust)
    assert serial == old and ask(before) == 401
    new = put_pair(systemd, pki.make_server_cert(ca))
    systemd.systemctl("reload", "llmgwd.service")
    deadline = time.monotonic() + 20
    while (seen := connect(trust))[1] != new and time.monotonic() < deadline:
        seen[0].close()
        time.sleep(0.2)
    after, serial = seen
    assert serial == new, systemd.journal("llmgwd.service", lines=30)
    assert ask(after) == 401
    opened = before.sock
    assert ask(before) == 401  # the connection opened before the reload still answers
    assert before.sock is opened  # the same one: http.client did not connect again
    assert node.main_pid("llmgwd.service") == pid
    state = systemd.systemctl("show", "-P", "ActiveState", "llmgwd.service").stdout.strip()
    assert state == "active"
    assert f"serial {new}" in systemd.journal("llmgwd.service", lines=50)
    for conn in (before, after):
        conn.close()
