"""The device half of `llmgw login --device` (RFC 8628, for a terminal with no browser): llmgwd
starts the device authorization and polls the provider, the person confirms the user code on
any device, and this waits as long as llmgwd says between polls."""

from __future__ import annotations

import secrets
import ssl
import time

import click
import msgspec

from llmgw.api_types import DeviceAuthorization, DevicePending, DevicePoll, DeviceStart, LoginAnswer
from llmgw.cli.common import Refused, decoded
from llmgw.cli.login_http import call

GRACE_S = 30.0  # past the code's life, in case the provider is late to say it expired


class _Polled(msgspec.Struct):
    """What tells a poll's answers apart: a status (DevicePending), or none (LoginAnswer)."""

    status: str | None = None


def pause(seconds: float) -> None:
    """Wait between polls (a function of its own, for the tests)."""
    time.sleep(seconds)


def show_code(auth: DeviceAuthorization) -> None:
    """Tell the person where to confirm which code (a function of its own, for the tests)."""
    click.echo(
        f"To sign in, open {auth.verification_uri} on any device and enter the code\n\n"
        f"  {auth.user_code}\n"
    )
    if auth.verification_uri_complete:
        click.echo(f"(or open {auth.verification_uri_complete})\n")


def device_sign_in(server: str, tls: ssl.SSLContext | None = None) -> LoginAnswer:
    """Show the user code and where to confirm it; poll until signed in, refused or expired
    (tls: whom to trust at server, None for the system's CAs)."""
    nonce = secrets.token_urlsafe(24)
    url = server + "/api/v1/login/device"
    auth = decoded(call("POST", url, DeviceStart(nonce=nonce), tls=tls), DeviceAuthorization)
    show_code(auth)
    interval = auth.interval
    deadline = time.monotonic() + auth.expires_in + GRACE_S
    while time.monotonic() < deadline:
        pause(interval)
        poll = DevicePoll(device_code=auth.device_code, nonce=nonce, interval=interval)
        answer = call("POST", url + "/token", poll, tls=tls)
        if decoded(answer, _Polled).status is None:
            return decoded(answer, LoginAnswer)
        interval = decoded(answer, DevicePending).interval
    raise Refused("the sign-in's user code expired before it was confirmed")
