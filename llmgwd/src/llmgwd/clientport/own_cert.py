"""The client port's certificate when the site configures none: issued by the cluster CA for
this host's names and addresses (and client.public_url's host), renewed before it ends."""

from __future__ import annotations

import asyncio
import datetime
import fcntl
import ipaddress
import logging
import os
import socket
import ssl
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from llmgw import pki
from llmgw.config import ServerConfig

log = logging.getLogger("llmgwd.clientport.own_cert")

OWN_DAYS = 90  # as an ACME certificate: renewed at two thirds of it, day 60
CHECK_S = 3600.0  # how often the certificate's age and the host's addresses are looked at
_SIOCGIFADDR = 0x8915
_IF_INET6 = Path("/proc/net/if_inet6")
_SYS_NET = "/sys/class/net"

Sans = tuple[list[str], list[str]]  # DNS names, IP addresses


def _interfaces() -> list[str]:
    """The network interfaces' names, from /sys/class/net: if_nameindex() opens a netlink
    socket, which llmgwd's unit does not allow (RestrictAddressFamilies)."""
    try:
        return sorted(os.listdir(_SYS_NET))
    except OSError:
        return []


def ipv4_addresses() -> list[str]:
    """Each interface's IPv4 address (SIOCGIFADDR)."""
    found: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in _interfaces():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # an interface with no IPv4 address
            found.append(socket.inet_ntoa(raw[20:24]))
    return found


def ipv6_addresses() -> list[str]:
    """Each interface's IPv6 addresses but link-local ones (no client names those in a URL)."""
    try:
        lines = _IF_INET6.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 4 and fields[3] != "20":  # scope 0x20: link-local
            found.append(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    return found


def _split(hosts: Iterable[str]) -> Sans:
    names: set[str] = set()
    ips: set[str] = set()
    for host in hosts:
        try:
            ips.add(str(ipaddress.ip_address(host)))
        except ValueError:
            if host:
                names.add(host)
    return sorted(names), sorted(ips)


def host_sans(cfg: ServerConfig) -> Sans:
    """What the client port's own certificate is for: localhost, the host's names and
    addresses, client.public_url's host, and the listen address when it is one."""
    hosts = ["localhost", socket.gethostname(), socket.getfqdn(), "127.0.0.1", "::1"]
    hosts += ipv4_addresses() + ipv6_addresses()
    hosts.append(urlsplit(cfg.client.public_url).hostname or "")
    listen = cfg.client.listen.rpartition(":")[0].strip("[]")
    if listen not in ("", "0.0.0.0", "::"):
        hosts.append(listen)
    return _split(hosts)


@dataclass(slots=True)
class OwnCert:
    """The certificate (with the CA after it: the chain a client pins from) and key in dir,
    made again when missing, two thirds through its life, for other names, or of another CA."""

    ca: pki.CertKey
    dir: Path
    sans: Callable[[], Sans]
    tls: ssl.SSLContext | None = field(default=None)

    @property
    def cert_file(self) -> Path:
        return self.dir / "client.pem"

    @property
    def key_file(self) -> Path:
        return self.dir / "client.key"

    def _stamp(self) -> str:
        names, ips = self.sans()
        return " ".join([pki.ca_fingerprint(self.ca.cert_pem), *names, *ips])

    def due(self) -> bool:
        """Whether the certificate must be made (again) now."""
        stamp = self.dir / "client.sans"
        try:
            if stamp.read_text() != self._stamp():
                return True
            start, end = pki.validity(self.cert_file.read_bytes())
        except (OSError, pki.PKIError):
            return True
        now = datetime.datetime.now(datetime.UTC)
        return now >= start + (end - start) * pki.RENEW_AT

    def make(self) -> None:
        """Issue a new certificate from the cluster CA and write it, its chain and key."""
        names, ips = self.sans()
        leaf = pki.make_server_cert(self.ca, names, ips, days=OWN_DAYS)
        chain = pki.CertKey(leaf.cert_pem + self.ca.cert_pem, leaf.key_pem)
        pki.write_pair(chain, self.cert_file, self.key_file)
        (self.dir / "client.sans").write_text(self._stamp())
        log.info(
            "the client port's certificate, from the cluster CA (sha256 %s): for %s",
            pki.ca_fingerprint(self.ca.cert_pem),
            ", ".join(names + ips),
        )

    def load(self) -> ssl.SSLContext:
        """The client port's TLS context with this certificate, made first if due."""
        if self.due():
            self.make()
        self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.tls.load_cert_chain(self.cert_file, self.key_file)
        return self.tls

    def remake(self) -> bool:
        """Make the certificate again if due: whether it was. It blocks (the host's names,
        getfqdn a DNS lookup; a key; files): renew runs it in a thread."""
        if self.tls is None or not self.due():
            return False
        self.make()
        return True

    async def renew(self) -> bool:
        """Make the certificate again if due, off the event loop (remake); new connections
        get it (the context is the same one the port serves with). Whether it was renewed."""
        if not await asyncio.to_thread(self.remake):
            return False
        assert self.tls is not None
        self.tls.load_cert_chain(self.cert_file, self.key_file)  # on the loop, which serves it
        return True

    async def run(self) -> None:
        """Renew when due, looked at every CHECK_S, for as long as llmgwd runs."""
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                await self.renew()  # with DNS down, getfqdn waits out the resolver's timeout
            except (OSError, ssl.SSLError, pki.PKIError) as e:
                log.error("the client port's certificate could not be renewed: %s", e)
