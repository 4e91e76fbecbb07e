"""Who a request came from: its TCP peer, or, when that peer is one of client.trusted_proxies,
X-Forwarded-For's right-most address that is not; never a header from anyone else."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from aiohttp import hdrs, web

CLIENT = web.RequestKey("llmgw.client", str)  # the address the client port took as the client
PROXIED = web.RequestKey("llmgw.proxied", bool)  # its TCP peer is one of client.trusted_proxies
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _address(text: str) -> Address | None:
    """An address of a header or a peer ([v6] and a v4-mapped v6 taken), or None."""
    text = text.strip()
    if text.startswith("[") and "]" in text:
        text = text[1 : text.index("]")]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class TrustedProxies:
    """The reverse proxies whose X-Forwarded-For is believed (addresses or CIDR networks)."""

    def __init__(self, networks: Sequence[str]) -> None:
        self.networks = [ipaddress.ip_network(n, strict=False) for n in networks]

    def trusts(self, address: str) -> bool:
        """Whether address is one of the proxies."""
        ip = _address(address)
        return ip is not None and any(ip in net for net in self.networks)

    def client(self, peer: str, forwarded: Sequence[str]) -> str:
        """The client's address: peer itself unless it is trusted; then X-Forwarded-For's
        (forwarded: each header's value, in order) right-most address not trusted, the walk
        ending at an entry that is no address (the hop that wrote it is the client then);
        all of them trusted, the left-most."""
        if not self.networks or not self.trusts(peer):
            return peer
        hops = [h for value in forwarded for h in value.split(",") if h.strip()]
        client = peer
        for hop in reversed(hops):
            ip = _address(hop)
            if ip is None:
                break
            client = str(ip)
            if not any(ip in net for net in self.networks):
                break
        return client


def client_address(request: web.BaseRequest) -> str:
    """The address the client port took as the request's client ('' when it has none)."""
    return request.get(CLIENT) or request.remote or ""


def proxied(request: web.BaseRequest) -> bool:
    """Whether a trusted proxy brought the request: its TCP peer says nothing of the client."""
    return bool(request.get(PROXIED))


def forwarded_tls(request: web.BaseRequest) -> bool:
    """Whether the trusted proxy that brought the request says its client spoke TLS to it
    (X-Forwarded-Proto's right-most value, the one it wrote)."""
    values = [v for h in request.headers.getall("X-Forwarded-Proto", []) for v in h.split(",")]
    return bool(values) and values[-1].strip().lower() == "https"


def forwarded_for(request: web.BaseRequest) -> list[str]:
    """Every X-Forwarded-For header's value, in order."""
    return request.headers.getall(hdrs.X_FORWARDED_FOR, [])
