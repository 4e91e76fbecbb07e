"""/api/v1's tokens: a node's or a control plane's join token, the SCIM and scrape tokens."""

from __future__ import annotations

import msgspec


class TokenView(msgspec.Struct, kw_only=True):
    """POST /tokens, POST /planes/tokens: a new join token and the command that uses it."""

    token: str
    expires_in: int
    url: str
    command: str


class ScimTokenView(msgspec.Struct, kw_only=True):
    """POST /scim/token: the identity provider's new SCIM token, this once (the old one stops)."""

    token: str
    path: str = "/scim/v2"


class MetricsTokenView(msgspec.Struct, kw_only=True):
    """POST /metrics/token: Prometheus' new scrape token, this once (the old one stops); it
    reads /metrics and /metrics/engines on the client port and nothing else."""

    token: str
    path: str = "/metrics"
