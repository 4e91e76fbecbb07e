"""/api/v1's sign-ins: OIDC in a browser (/login/oidc) and by device (/login/device)."""

from __future__ import annotations

from typing import Literal

import msgspec


class OidcInfo(msgspec.Struct, kw_only=True):
    """GET /login/oidc: what `llmgw login` needs to send a person to the provider."""

    issuer: str
    authorization_endpoint: str
    client_id: str
    scopes: list[str]


class OidcLogin(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /login/oidc: a sign-in's code (with its PKCE verifier and redirect), which llmgwd
    trades for the ID token, or the ID token itself; the nonce sent to the provider."""

    nonce: str
    code: str = ""
    code_verifier: str = ""
    redirect_uri: str = ""
    id_token: str = ""


class LoginAnswer(msgspec.Struct, kw_only=True):
    """POST /login/oidc: the signed-in user and their session's key (shown once)."""

    user: str  # the user's id
    name: str
    key: str
    expires_at: float


# /login/device: `llmgw login --device`, the device authorization grant through llmgwd (which
# holds the client secret and checks the ID token); issue 13.
class DeviceStart(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /login/device: start a device sign-in; the nonce the CLI made for it."""

    nonce: str


class DeviceAuthorization(msgspec.Struct, kw_only=True):
    """POST /login/device: what the person is shown, and the code the CLI polls with (of use
    only with llmgwd's client secret)."""

    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str = ""
    expires_in: int  # seconds
    interval: int  # seconds between polls


class DevicePoll(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /login/device/token: one poll, with the interval the CLI keeps now."""

    device_code: str
    nonce: str
    interval: int = 5


class DevicePending(msgspec.Struct, kw_only=True):
    """POST /login/device/token, 202: not signed in yet; poll again after interval seconds."""

    status: Literal["authorization_pending", "slow_down"]
    interval: int
