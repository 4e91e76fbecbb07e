"""The one JSON call `llmgw login` makes to llmgwd's client port (no key: it signs in to get
one), over TLS trusting a context's pinned CA where it has one, through the proxy
cli.https.proxy_for selects; a refusal or an unreachable server ends the command with the
server's message."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

import msgspec

from llmgw import ipc
from llmgw.api_types import ErrorAnswer
from llmgw.cli import https
from llmgw.cli.common import Refused, Unreachable


def call(
    method: str, url: str, body: object = None, timeout: float = 30.0,
    tls: ssl.SSLContext | None = None,
) -> Any:  # fmt: skip
    """One JSON call (tls: whom to trust, None for the system's CAs); its answer decoded, or
    Refused/Unreachable."""
    data = msgspec.json.encode(body) if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)  # noqa: S310 (http(s) only)
    req.add_header("Content-Type", "application/json")
    try:
        via = https.proxy_for(url)  # urllib's own choice reads NO_PROXY otherwise
    except ipc.IpcError as e:
        raise Unreachable(str(e)) from None
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"https": via, "http": via} if via else {}),
        urllib.request.HTTPSHandler(context=tls),
    )
    try:
        with opener.open(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        try:
            message = msgspec.json.decode(e.read(), type=ErrorAnswer).error.message
        except msgspec.DecodeError:
            message = f"the server answered HTTP {e.code}"
        raise Refused(message) from None
    except (urllib.error.URLError, OSError) as e:
        raise Unreachable(f"{url}{https.through(url)}: {getattr(e, 'reason', e)}") from None
