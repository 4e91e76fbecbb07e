"""Outbound HTTP proxies: which calls leaving the cluster go through one, and how it is shown.

One Route is resolved from `network.proxy`/`network.no_proxy` (server.yaml, agent.yaml) or,
where the setting is absent, from HTTPS_PROXY/HTTP_PROXY/NO_PROXY in the daemon's environment.
It is given, as request arguments or as a child's environment, to the calls that leave the
cluster only: the mirror's hub and peers, OIDC, engine and package installs. Cluster-internal
sessions (the router's engines, the cluster port, etcd) never receive it and keep aiohttp's
trust_env off, so no environment puts a proxy between control planes, nodes and engines.
A proxy's user and password are never shown: every rendering goes through redact().
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from yarl import URL

DIRECT_WORDS = ("none", "direct")  # network.proxy: no proxy, whatever the environment says
# The variables children read a proxy from (lower case; ALL_PROXY too, which uv and curl read).
ENV_NAMES = frozenset({"https_proxy", "http_proxy", "all_proxy", "no_proxy"})


def redact(text: str) -> str:
    """Every URL's user:password@ in text replaced by ****@: all up to the last @ of the word,
    so that a password holding "@" or "/" (unencoded, as people write them) shows nothing."""
    return re.sub(r"(?<=://)\S*@", "****@", text)


def check_url(url: str) -> None:
    """A proxy URL the daemons can use (http://HOST:PORT, optionally with user:password);
    a ValueError that names it without its credentials."""
    try:
        u = URL(url)
    except ValueError:
        raise ValueError(f"proxy: {redact(url)!r} is not a URL") from None
    if u.scheme != "http" or not u.host or u.path not in ("", "/") or u.query_string:
        raise ValueError(f"proxy: {redact(url)!r} is not http://HOST:PORT")


def _entry_matches(entry: str, host: str, port: int | None) -> bool:
    """One NO_PROXY entry against a host: "*", a name (itself and every name under it, with
    or without a leading dot), an address, a network (CIDR), each with an optional :PORT."""
    entry = entry.strip().lower()
    if not entry:
        return False
    if entry == "*":
        return True
    name, sep, want_port = entry.rpartition(":") if entry.count(":") == 1 else ("", "", "")
    if sep and want_port.isdigit():
        if port != int(want_port):
            return False
        entry = name
    entry = entry.strip("[]")
    try:
        net = ipaddress.ip_network(entry, strict=False)
    except ValueError:
        net = None
    if net is not None:
        try:
            return ipaddress.ip_address(host.strip("[]")) in net
        except ValueError:
            return False
    entry = entry.lstrip(".")
    return host == entry or host.endswith("." + entry)


def bypassed(url: str | URL, no_proxy: tuple[str, ...]) -> bool:
    """Whether NO_PROXY's entries send a request to url straight, not through the proxy."""
    u = URL(url)
    host = (u.host or "").lower().rstrip(".")
    return any(_entry_matches(e, host, u.port) for e in no_proxy)


@dataclass(frozen=True, slots=True)
class Route:
    """The proxy each outbound URL goes through ("": straight). https:// targets go through
    https (a CONNECT tunnel), http:// ones through http; no_proxy lists hosts reached straight."""

    https: str = ""
    http: str = ""
    no_proxy: tuple[str, ...] = ()

    def proxy_for(self, url: str | URL) -> str:
        """The proxy URL a request to url goes through (with its credentials); "" for none."""
        u = URL(url)
        proxy = self.https if u.scheme == "https" else self.http if u.scheme == "http" else ""
        if not proxy or bypassed(u, self.no_proxy):
            return ""
        return proxy

    def request_kw(self, url: str | URL) -> dict[str, Any]:
        """aiohttp's request arguments for url: {"proxy": URL}, its user and password with
        it (aiohttp sends them as Proxy-Authorization, to the proxy only: in the CONNECT of
        an https:// target, beside the request of an http:// one); {} when it goes straight."""
        proxy = self.proxy_for(url)
        return {"proxy": URL(proxy)} if proxy else {}

    def env(self) -> dict[str, str]:
        """The route as a child's environment (uv, apt-get, dnf), in both cases the tools
        read; {} when there is no proxy. Children must keep it out of their command lines."""
        out: dict[str, str] = {}
        for name, value in (("https_proxy", self.https), ("http_proxy", self.http)):
            if value:
                out[name] = out[name.upper()] = value
        if out and self.no_proxy:
            out["no_proxy"] = out["NO_PROXY"] = ",".join(self.no_proxy)
        return out

    def shown(self) -> str:
        """The route in words, for logs and status: no credentials."""
        if not (self.https or self.http):
            return "no proxy"
        proxies = sorted({redact(p) for p in (self.https, self.http) if p})
        ex = f" (not for {', '.join(self.no_proxy)})" if self.no_proxy else ""
        return f"proxy {' and '.join(proxies)}{ex}"


DIRECT = Route()

_ENV_NAMES = {"https": ("HTTPS_PROXY", "https_proxy"), "http": ("HTTP_PROXY", "http_proxy")}


def _from_env(environ: Mapping[str, str], names: tuple[str, ...]) -> str:
    for name in names:
        if environ.get(name, "").strip():
            return environ[name].strip()
    return ""


def _split(value: str) -> tuple[str, ...]:
    return tuple(e.strip() for e in value.split(",") if e.strip())


def resolve(proxy: str, no_proxy: tuple[str, ...], environ: Mapping[str, str]) -> Route:
    """The route from the setting (network.proxy: one proxy for https and http; "none":
    straight) or, where it is "", from HTTPS_PROXY/HTTP_PROXY (either case); no_proxy from
    the setting, else NO_PROXY. An environment's proxy that is no http:// URL is a
    ValueError, said without its credentials."""
    excluded = no_proxy or _split(_from_env(environ, ("NO_PROXY", "no_proxy")))
    if proxy.lower() in DIRECT_WORDS:
        return DIRECT
    if proxy:
        check_url(proxy)
        return Route(proxy, proxy, excluded)
    https, http = (_from_env(environ, _ENV_NAMES[k]) for k in ("https", "http"))
    for value in (https, http):
        if value:
            check_url(value)
    return Route(https, http, excluded) if https or http else DIRECT


def _target(url: str | URL) -> str:
    u = URL(url)
    port = f":{u.explicit_port}" if u.explicit_port else ""
    return f"{u.host}{port}"


def explain(e: BaseException, route: Route, url: str | URL) -> str | None:
    """What a failed request through the proxy means, in words with no credentials ("proxy
    http://host:3128 refused the connection to huggingface.co: 403 Forbidden"); None when
    the request went straight or the failure is not the proxy's."""
    import aiohttp

    proxy = route.proxy_for(url)
    if not proxy:
        return None
    shown, target = redact(proxy), _target(url)
    if isinstance(e, aiohttp.ClientHttpProxyError):
        return f"proxy {shown} refused the connection to {target}: {e.status} {e.message}"
    if isinstance(e, aiohttp.ClientProxyConnectionError):
        why = redact(str(e.os_error.strerror or e.os_error))
        return f"proxy {shown} cannot be reached (to {target}): {why}"
    return None


def answered_by_proxy(route: Route, url: str | URL, status: int) -> str:
    """ " (through proxy http://host:3128)" to add to an error answer to a plain-http request
    that went through a proxy (which may be the proxy's own refusal); "" otherwise."""
    proxy = route.proxy_for(url)
    if not proxy or status < 400 or URL(url).scheme != "http":
        return ""
    return f" (through proxy {redact(proxy)})"
