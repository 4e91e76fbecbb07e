"""The OAuth 2.0 device authorization grant (RFC 8628) at the provider, as llmgwd's client: a
device authorization started, and one poll of the token endpoint told apart into pending,
slow down, refused, expired or the ID token; no code or token is ever logged."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from llmgwd.people.oidc import Provider, SignInError

log = logging.getLogger(__name__)

GRANT = "urn:ietf:params:oauth:grant-type:device_code"
DEFAULT_INTERVAL_S = 5  # RFC 8628 3.2: when the provider names none
SLOW_DOWN_S = 5  # RFC 8628 3.5: added to the interval at each slow_down
MAX_INTERVAL_S = 60


@dataclass(frozen=True)
class Started:
    """A device authorization: what the person is shown, and the code to poll with."""

    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str
    expires_in: int
    interval: int


@dataclass(frozen=True)
class Pending:
    """Not yet: poll again after interval seconds (grown by a slow_down)."""

    interval: int
    slow_down: bool


async def start(provider: Provider, nonce: str) -> Started:
    """Ask the provider for a device code and a user code for the settings' scopes."""
    form = {"scope": " ".join(provider.settings.scopes), "nonce": nonce}
    status, answer = await provider.post_form("device_authorization_endpoint", form)
    try:
        started = Started(
            device_code=str(answer["device_code"]),
            user_code=str(answer["user_code"]),
            verification_uri=str(answer["verification_uri"]),
            verification_uri_complete=str(answer.get("verification_uri_complete", "")),
            expires_in=int(answer["expires_in"]),
            interval=_interval(answer.get("interval", DEFAULT_INTERVAL_S)),
        )
    except (KeyError, TypeError, ValueError):
        why = str(answer.get("error", ""))[:64]
        log.info("oidc: the provider refused a device authorization (HTTP %d %s)", status, why)
        raise SignInError(
            502, "device_refused", "the provider refused to start a device sign-in"
        ) from None
    return started


def _interval(value: object) -> int:
    seconds = int(value) if isinstance(value, int | float | str) else DEFAULT_INTERVAL_S
    return min(max(seconds, 1), MAX_INTERVAL_S)


async def poll(provider: Provider, device_code: str, interval: int) -> str | Pending:
    """One poll of the token endpoint: the ID token once the person has signed in, Pending
    while they have not; a refusal or an expired code raises SignInError."""
    form = {"grant_type": GRANT, "device_code": device_code}
    status, answer = await provider.post_form("token_endpoint", form)
    if status == 200 and "id_token" in answer:
        return str(answer["id_token"])
    error = str(answer.get("error", ""))
    if error == "authorization_pending":
        return Pending(interval=_interval(interval), slow_down=False)
    if error == "slow_down":
        return Pending(interval=_interval(interval + SLOW_DOWN_S), slow_down=True)
    if error == "access_denied":
        raise SignInError(403, "access_denied", "the sign-in was refused at the provider")
    if error == "expired_token":
        raise SignInError(
            401, "expired_token", "the sign-in's user code expired before it was confirmed"
        )
    log.info("oidc: the provider refused a device code (HTTP %d %s)", status, error[:64])
    raise SignInError(401, "code_refused", "the provider refused the sign-in's device code")
