"""Where a provider's upstream may be: https://, or http:// on the loopback only (the
credential never crosses a network in clear), and never a link-local address (169.254.0.0/16,
fe80::/10: a cloud's metadata service, whose answers hold the host's own credentials), whether
the URL names one or its host name resolves to one when the router connects."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def forbidden(address: str) -> bool:
    """Whether an IP address is one no upstream may be at: link-local (IPv4, IPv6 or
    IPv4-mapped) or unspecified. A host name is not an address: False."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # fe80::1%eth0
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_link_local or ip.is_unspecified


def url_refusal(url: str) -> str | None:
    """Why url may not be an upstream's, else None (staff's words: it names no secret)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme == "http" and host not in LOOPBACK_HOSTS:
        return "must be https:// (http:// on the loopback only: the credential goes in clear)"
    if parts.scheme not in ("https", "http"):
        return "must be https://"
    if forbidden(host):
        return "is a link-local address (a cloud's metadata service): refused"
    return None


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, less the forbidden addresses a name resolves to (none left: an
    OSError, which aiohttp reports as a failed connection). aiohttp skips the resolver for a
    URL that names an IP address: url_refusal checks those. Through the site's egress proxy
    the proxy resolves the name, and this guards only the proxy's own address."""

    def __init__(self, inner: AbstractResolver | None = None) -> None:
        self._inner = inner if inner is not None else DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """host's addresses that an upstream may be at."""
        found = await self._inner.resolve(host, port, family)
        kept = [r for r in found if not forbidden(str(r["host"]))]
        if not kept:
            raise OSError(f"{host} resolves to a link-local address only: refused")
        return kept

    async def close(self) -> None:
        """Close the resolver it wraps."""
        await self._inner.close()
