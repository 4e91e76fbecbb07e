"""/api/v1/login/device: `llmgw login --device`, the device authorization grant through
llmgwd, which alone holds the client secret: POST /device starts one at the provider, POST
/device/token polls the provider once for the CLI and answers pending (202) or the session."""

from __future__ import annotations

from aiohttp import web

from llmgw.api_types import DeviceAuthorization, DevicePending, DevicePoll, DeviceStart
from llmgwd.api.base import json_response, read_body
from llmgwd.api.login_session import parts, refuse, session_for
from llmgwd.people import oidc_device
from llmgwd.people.oidc import SignInError


async def post_device(request: web.Request) -> web.StreamResponse:
    """Start a device sign-in: the user code and the page the person confirms it on."""
    provider, _ = parts(request)
    body = await read_body(request, DeviceStart)
    try:
        started = await oidc_device.start(provider, body.nonce)
    except SignInError as e:
        raise refuse(e) from None
    return json_response(
        DeviceAuthorization(
            device_code=started.device_code,
            user_code=started.user_code,
            verification_uri=started.verification_uri,
            verification_uri_complete=started.verification_uri_complete,
            expires_in=started.expires_in,
            interval=started.interval,
        )
    )


async def post_device_token(request: web.Request) -> web.StreamResponse:
    """One poll: 202 with the interval to wait while the person has not confirmed, the
    session once they have (its ID token checked as at /login/oidc), or the refusal."""
    provider, _ = parts(request)
    body = await read_body(request, DevicePoll)
    try:
        got = await oidc_device.poll(provider, body.device_code, body.interval)
        if isinstance(got, oidc_device.Pending):
            pending = DevicePending(
                status="slow_down" if got.slow_down else "authorization_pending",
                interval=got.interval,
            )
            return json_response(pending, 202)
        claims = await provider.verify(got, body.nonce, nonce_needed=False)
    except SignInError as e:
        raise refuse(e) from None
    return json_response(await session_for(request, claims))
