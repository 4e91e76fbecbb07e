"""Who may read the mirror through /hf: any live llmgw key, as huggingface_hub sends HF_TOKEN."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmgwd.api.base import KeyLookup

log = logging.getLogger(__name__)

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="llmgw"'}


def _refuse(message: str) -> web.Response:
    # The hub's own shape: {"error": ...} with X-Error-Message; huggingface_hub shows it.
    headers = {**_CHALLENGE, "X-Error-Message": message}
    return web.json_response({"error": message}, status=401, headers=headers)


def key_auth(keys: KeyLookup) -> Middleware:
    """A user or admin key as `Authorization: Bearer KEY` (HF_TOKEN=sk-llmgw-...)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return _refuse("an llmgw key is needed: set HF_TOKEN to it")
        key = keys.authenticate(secret.strip())
        if key is None:
            return _refuse("the key is not valid (or was revoked)")
        return await handler(request)

    return middleware
