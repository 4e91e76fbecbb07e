"""Debian's slapd started as a plain process on a private loopback port, with a configuration
and a database of its own in a temporary directory, StartTLS by a certificate of a test CA."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ldap3

from llmgw import pki

SLAPD = shutil.which("slapd") or ("/usr/sbin/slapd" if Path("/usr/sbin/slapd").exists() else "")
SUFFIX = "dc=example,dc=org"
ADMIN = f"cn=admin,{SUFFIX}"
PASSWORD = "s3cret-bind-password"
PEOPLE, GROUPS = f"ou=people,{SUFFIX}", f"ou=groups,{SUFFIX}"

CONF = """include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
include /etc/ldap/schema/nis.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {d}/slapd.pid
TLSCACertificateFile {d}/ca.pem
TLSCertificateFile {d}/server.pem
TLSCertificateKeyFile {d}/server.key
database mdb
suffix "{suffix}"
rootdn "{admin}"
rootpw {password}
directory {d}/db
maxsize 10485760
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Slapd:
    """A running slapd: its URL, CA file, and a connection of its admin to change it."""

    dir: Path
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"ldap://127.0.0.1:{self.port}"

    def admin(self) -> ldap3.Connection:
        return ldap3.Connection(
            ldap3.Server("127.0.0.1", port=self.port), ADMIN, PASSWORD, auto_bind=True
        )

    def add(self, dn: str, classes: list[str], attributes: dict[str, Any]) -> bool:
        """Add an entry as the admin; False if it is there already."""
        with self.admin() as c:
            add: Callable[..., bool] = c.add  # types-ldap3 leaves it untyped
            return add(dn, classes, attributes)

    def add_person(self, uid: str, mail: str = "") -> None:
        """A person uid whose mail is mail (else uid@acme.example)."""
        attributes = {"cn": uid, "sn": uid, "mail": mail or f"{uid}@acme.example"}
        self.add(f"uid={uid},{PEOPLE}", ["inetOrgPerson"], attributes)

    def set_group(self, cn: str, *uids: str) -> None:
        """Group cn with exactly these people (a groupOfNames needs one member: the admin)."""
        members = [f"uid={u},{PEOPLE}" for u in uids] or [ADMIN]
        dn = f"cn={cn},{GROUPS}"
        if not self.add(dn, ["groupOfNames"], {"cn": cn, "member": members}):
            with self.admin() as c:
                modify: Callable[..., bool] = c.modify  # types-ldap3 leaves it untyped
                modify(dn, {"member": [(ldap3.MODIFY_REPLACE, members)]})

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def start(d: Path) -> Slapd:
    """slapd in d on a free loopback port, its suffix, people and groups made."""
    ca = pki.make_ca("ldap-test")
    pki.write_pair(ca, d / "ca.pem", d / "ca.key")
    pki.write_pair(pki.make_server_cert(ca, ["localhost"], ["127.0.0.1"]),
                   d / "server.pem", d / "server.key")  # fmt: skip
    (d / "db").mkdir()
    conf = d / "slapd.conf"
    conf.write_text(CONF.format(d=d, suffix=SUFFIX, admin=ADMIN, password=PASSWORD))
    port = _free_port()
    proc = subprocess.Popen(
        [
            SLAPD,
            "-d",
            "0",
            "-f",
            str(conf),
            "-h",
            f"ldap://127.0.0.1:{port}/ ldap://127.0.0.2:{port}/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = Slapd(d, port, proc)
    _wait(port, proc)
    server.add(SUFFIX, ["dcObject", "organization"], {"o": "example", "dc": "example"})
    for ou in ("people", "groups"):
        server.add(f"ou={ou},{SUFFIX}", ["organizationalUnit"], {"ou": ou})
    return server


def _wait(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"slapd exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("slapd did not listen in 20 s")
