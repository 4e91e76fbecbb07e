"""The cluster's CA fetched from a cluster port and pinned by a join token's hash: the first
step of a node's join and of a control plane's (`llmgw node join`, `llmgw plane join`)."""

from __future__ import annotations

from urllib.parse import urlsplit

import aiohttp

from llmgw import pki

MAX_CA_BYTES = 64 << 10


class PinError(Exception):
    """The URL, the cluster port or its CA is not what the token names; the message says
    which, and never holds the token."""


def check_url(url: str) -> str:
    """https://HOST:PORT of a cluster port, or PinError."""
    parts = urlsplit(url.strip())
    if parts.scheme != "https" or not parts.hostname or parts.path.strip("/"):
        raise PinError(f"the control plane's URL must look like https://HOST:7710, not {url!r}")
    return f"https://{parts.netloc}"


async def fetch_pinned(session: aiohttp.ClientSession, url: str, token: str, kind: str) -> bytes:
    """The CA the cluster port at url offers (fetched unverified), accepted only when its hash
    is the one the token (a "join token" or "plane token": kind) names."""
    ca_pem = await _fetch(session, url)
    if not pki.token_matches_ca(token, ca_pem):
        raise PinError(
            f"the CA at {url} (sha256 {pki.ca_fingerprint(ca_pem)[:32]}) is not the one "
            f"the {kind} names; the token was not sent"
        )
    return ca_pem


async def _fetch(session: aiohttp.ClientSession, url: str) -> bytes:
    try:
        async with session.get(f"{url}/ca", ssl=False) as resp:
            body = await resp.content.read(MAX_CA_BYTES + 1)
            if resp.status != 200:
                raise PinError(
                    f"{url}/ca answered HTTP {resp.status}; is it an llmgw cluster port?"
                )
    except (aiohttp.ClientError, TimeoutError) as e:
        raise PinError(f"cannot reach {url}: {e or type(e).__name__}") from None
    try:
        if len(body) > MAX_CA_BYTES:
            raise pki.PKIError("too large")
        pki.check_ca(body)
    except pki.PKIError as e:
        raise PinError(f"{url}/ca did not send a CA certificate ({e})") from None
    return body
