"""The OpenID Connect provider as llmgwd sees it: its discovery document and keys, a sign-in's
code traded for tokens, and the ID token checked (signature by the provider's JWKS, issuer,
audience, expiry, nonce); no token or secret is ever in a log line or an error message."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from llmgw import proxy
from llmgw.config import Oidc

log = logging.getLogger(__name__)

ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA"]
LEEWAY_S = 60  # clocks apart by this much still agree on a token's times
KEYS_TTL_S = 600.0  # the provider's keys are read again after this (or on an unknown kid)
TIMEOUT = aiohttp.ClientTimeout(total=15)


class SignInError(Exception):
    """A sign-in refused; the message is shown to the caller and names no token."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


BAD_TOKEN = SignInError(401, "invalid_id_token", "the provider's ID token is not valid here")


@dataclass
class Provider:
    """The configured provider: endpoints from its discovery document, keys from its JWKS."""

    settings: Oidc
    route: proxy.Route = proxy.DIRECT  # network.proxy: the provider is outside the cluster
    _meta: dict[str, Any] = field(default_factory=dict)
    _keys: KeySet | None = None
    _keys_at: float = 0.0

    async def _get_json(self, url: str) -> dict[str, Any]:
        kw = self.route.request_kw(url)
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as http, http.get(url, **kw) as resp:
                resp.raise_for_status()
                data = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            by_proxy = proxy.explain(e, self.route, url)
            log.warning("oidc: %s: %s", url, by_proxy or type(e).__name__)
            why = f"cannot read {url}" + (f": {by_proxy}" if by_proxy else "")
            raise SignInError(502, "provider_unreachable", why) from None
        if not isinstance(data, dict):
            raise SignInError(502, "provider_unreachable", f"{url} is not a JSON object")
        return data

    async def metadata(self) -> dict[str, Any]:
        """The provider's discovery document (read once)."""
        if not self._meta:
            url = self.settings.issuer + "/.well-known/openid-configuration"
            meta = await self._get_json(url)
            if meta.get("issuer") != self.settings.issuer:
                raise SignInError(502, "provider_mismatch", f"{url} names another issuer")
            self._meta = meta
        return self._meta

    async def keys(self, *, fresh: bool = False) -> KeySet:
        """The provider's signing keys, read again when old or when fresh is asked."""
        if self._keys is None or fresh or time.monotonic() - self._keys_at > KEYS_TTL_S:
            jwks = await self._get_json(str((await self.metadata())["jwks_uri"]))
            try:
                self._keys = KeySet.import_key_set({"keys": jwks["keys"]})
            except (JoseError, ValueError, KeyError, TypeError):
                why = "the provider's keys cannot be read"
                raise SignInError(502, "provider_keys", why) from None
            self._keys_at = time.monotonic()
        return self._keys

    async def client_form(self) -> dict[str, str]:
        """The client's own fields for a call to the provider: its id, and its secret (read
        from its file at each call, never logged)."""
        form = {"client_id": self.settings.client_id}
        if self.settings.client_secret_file:
            path = Path(self.settings.client_secret_file)
            form["client_secret"] = (await asyncio.to_thread(path.read_text)).strip()
        return form

    async def post_form(self, endpoint: str, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """POST form, with the client's id and secret, to the discovery document's endpoint;
        the HTTP status and the JSON answer ({} when it is not a JSON object)."""
        url = str((await self.metadata()).get(endpoint, ""))
        if not url:
            raise SignInError(502, "provider_unsupported", f"the provider has no {endpoint}")
        kw = self.route.request_kw(url)
        try:
            async with (
                aiohttp.ClientSession(timeout=TIMEOUT) as http,
                http.post(url, data=form | await self.client_form(), **kw) as resp,
            ):
                answer = await resp.json(content_type=None)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            by_proxy = proxy.explain(e, self.route, url)
            log.warning("oidc: %s: %s", endpoint, by_proxy or type(e).__name__)
            why = f"cannot reach the provider's {endpoint}" + (f": {by_proxy}" if by_proxy else "")
            raise SignInError(502, "provider_unreachable", why) from None
        return status, answer if isinstance(answer, dict) else {}

    async def redeem(self, code: str, verifier: str, redirect_uri: str) -> str:
        """Trade a sign-in's code (with its PKCE verifier) for the ID token, as the client."""
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": redirect_uri,
        }
        status, answer = await self.post_form("token_endpoint", form)
        if status != 200 or "id_token" not in answer:
            why = str(answer.get("error", ""))[:64]
            log.info("oidc: the provider refused a code (HTTP %d %s)", status, why)
            raise SignInError(401, "code_refused", "the provider refused the sign-in's code")
        return str(answer["id_token"])

    async def verify(
        self, id_token: str, nonce: str, *, nonce_needed: bool = True
    ) -> dict[str, Any]:
        """The ID token's claims, once its signature, issuer, audience, times and nonce hold
        (without nonce_needed, a token with no nonce passes: one the token endpoint gave
        llmgwd itself, in the device grant; a token's nonce must still be the one sent)."""
        try:
            token = jwt.decode(id_token, await self.keys(), algorithms=ALGORITHMS)
        except JoseError:
            try:  # a key rotated in since the keys were read
                token = jwt.decode(id_token, await self.keys(fresh=True), algorithms=ALGORITHMS)
            except (JoseError, ValueError):
                raise BAD_TOKEN from None
        except ValueError:
            raise BAD_TOKEN from None
        registry = jwt.JWTClaimsRegistry(
            leeway=LEEWAY_S,
            iss={"essential": True, "value": self.settings.issuer},
            aud={"essential": True, "value": self.settings.client_id},
            exp={"essential": True},
            sub={"essential": True},
            nonce={"essential": nonce_needed, "value": nonce},
        )
        try:
            registry.validate(token.claims)
        except JoseError as e:
            log.info("oidc: an ID token refused (%s)", e.error)
            raise BAD_TOKEN from None
        return dict(token.claims)
