"""The one JSON call `llmgw login` makes to llmgwd's client port (no key: it signs in to get
one), over TLS trusting a context's pinned CA where it has one; a refusal or an unreachable
server ends the command with the server's message."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

import msgspec

from llmgw.api_types import ErrorAnswer
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
        with urllib.request.urlopen(req, timeout=timeout, context=tls) as resp:  # noqa: S310 (http(s) only)
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        try:
            message = msgspec.json.decode(e.read(), type=ErrorAnswer).error.message
        except msgspec.DecodeError:
            message = f"the server answered HTTP {e.code}"
        raise Refused(message) from None
    except (urllib.error.URLError, OSError) as e:
        raise Unreachable(f"{url}: {getattr(e, 'reason', e)}") from None
