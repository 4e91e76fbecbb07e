"""External providers' APIs, reached the way an engine is (router/proxy.py relays, folds and
counts the answer): the URL, the upstream's model name and the credential are the catalog's
(staff's) alone, the credential opened from its sealed form only to be sent there, never logged,
shown or put in an error. An OpenAI-compatible upstream serves OpenAI's routes, an Anthropic one
the Messages routes; its refusals and failures are the route's errors in the router's words."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from llmgw.proxy import Route as ProxyRoute
from llmgwd.catalog import Model, ModelUpstream
from llmgwd.nodes.pool import Endpoint
from llmgwd.providers.addresses import GuardedResolver, url_refusal
from llmgwd.providers.credentials import CredentialError, Credentials
from llmgwd.router import errors
from llmgwd.router.engine_client import ConnectionLost, EngineError, ReadTimeout
from llmgwd.router.route import Route

log = logging.getLogger("llmgwd.router")

# The routes each protocol serves (route.path): an OpenAI-compatible API's, or Anthropic's.
SERVES = {
    "openai": frozenset({"chat/completions", "completions", "embeddings", "responses"}),
    "anthropic": frozenset({"messages", "messages/count_tokens"}),
}
ANTHROPIC_VERSION = "2023-06-01"
DEADLINE_S = 600.0  # client.provider_deadline_s's default
NODE = "(provider)"  # an Endpoint's node for an upstream: no node is named so
MIN_CONNECT_S = 10.0  # the far side of the internet, maybe through a proxy: more than an engine
_BUSY = (429, 503, 529)  # the upstream's rate limit or overload: the client may retry
_REFUSED_US = (401, 403)  # llmgw's credential refused: the site's fault, never the client's
_MAX_RETRY_AFTER_S = 600
# The most an answer may hold: a whole one is held in memory (16 MiB: far over any model's
# longest text, or an embeddings batch's vectors); a relayed stream is passed on as it comes,
# and bound all the same against one that never ends.
MAX_ANSWER_BYTES = 16 << 20
MAX_STREAM_BYTES = 64 << 20
# OpenAI's routes that store an exchange when asked (Responses by default) and take
# prompt_cache_key; its legacy completions and embeddings take neither.
_STORED = frozenset({"chat/completions", "responses"})


class AnswerTooLarge(EngineError):
    """The provider's answer passed MAX_ANSWER_BYTES (whole) or MAX_STREAM_BYTES (a stream)."""


class PastDeadline(ReadTimeout):
    """The provider's answer had not ended by the router's deadline (client.provider_deadline_s)."""


class ProviderReply:
    """An upstream's answer read as router/proxy.py reads an engine's (engine_client.Answer):
    aiohttp's failures become the engine client's errors, which name no address or key; its
    bytes bounded, and its end due by deadline (the event loop's time)."""

    def __init__(self, response: aiohttp.ClientResponse, deadline: float) -> None:
        self._response = response
        self._deadline = deadline
        self._read = 0
        self.status = response.status
        self.content_type = response.content_type

    @property
    def headers(self) -> dict[str, str]:
        """The answer's headers, their names in lower case."""
        return {k.lower(): v for k, v in self._response.headers.items()}

    async def read(self) -> bytes:
        """The whole body, at most MAX_ANSWER_BYTES."""
        body = bytearray()
        while chunk := await self._next(MAX_ANSWER_BYTES):
            body += chunk
        return bytes(body)

    async def readany(self) -> bytes:
        """What came since the last read; b"" at the end; at most MAX_STREAM_BYTES in all."""
        return await self._next(MAX_STREAM_BYTES)

    async def _next(self, limit: int) -> bytes:
        try:
            async with asyncio.timeout_at(self._deadline):
                chunk = await self._response.content.readany()
        except TimeoutError:
            if asyncio.get_running_loop().time() >= self._deadline:
                raise PastDeadline("the provider's answer passed the deadline") from None
            raise ReadTimeout("the provider sent nothing for the read timeout") from None
        except Exception as e:
            raise _reading_failed(e) from None
        self._read += len(chunk)
        if self._read > limit:
            raise AnswerTooLarge(f"the provider's answer passed {limit} bytes")
        return chunk

    def finish_writing(self) -> None:
        """The request was sent whole already: the rest is read (and counted) until it ends."""

    def close(self) -> None:
        """Drop the connection (the upstream stops); a no-op once the answer was read."""
        self._response.close()


def _check_url(model: Model, up: ModelUpstream) -> None:
    """A 502 for a URL the API refuses now (one stored before the rule is never sent to)."""
    why = url_refusal(up.url)
    if why is not None:
        log.warning("provider of %s at %s: its URL %s", model.name, up.url, why)
        raise errors.upstream_failed(
            f"The external provider of model '{errors.quote(model.name)}' is at an address "
            "llmgw does not send to; staff can check it."
        )


def _reading_failed(e: BaseException) -> EngineError:
    if isinstance(e, TimeoutError):
        return ReadTimeout("the provider sent nothing for the read timeout")
    return ConnectionLost(f"the provider's answer broke ({type(e).__name__})", reused=False,
                          answered=True)  # fmt: skip


class Providers:
    """The aiohttp session the router reaches external providers with (TLS, the site's egress
    proxy if one is set) and their credentials, opened once each."""

    def __init__(
        self,
        secret: bytes,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        retry_after_s: int,
        egress: ProxyRoute | None = None,
        deadline_s: float = DEADLINE_S,
    ) -> None:
        self._credentials = Credentials(secret)
        self.deadline_s = deadline_s  # an answer's end, from the request sent
        self._opened: dict[tuple[str, str], str] = {}
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=max(connect_timeout_s, MIN_CONNECT_S), sock_read=read_timeout_s
        )
        self._retry_after_s = retry_after_s
        self._egress = egress if egress is not None else ProxyRoute()
        self._session: aiohttp.ClientSession | None = None

    def check(self, model: Model, route: Route) -> None:
        """400 model_not_supported for a route the model's upstream API does not serve."""
        assert model.upstream is not None
        if route.path not in SERVES[model.upstream.protocol]:
            raise errors.model_not_supported(model.name, f"/v1/{route.path}")

    def endpoint(self, model: Model) -> Endpoint:
        """The upstream as the proxy's Endpoint: its URL, never its credential."""
        assert model.upstream is not None
        return Endpoint(replica_id="provider", model=model.name, node=NODE,
                        url=model.upstream.url, api_key="")  # fmt: skip

    async def close(self) -> None:
        """Close the session's connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(self, model: Model, route: Route, body: bytes, stream: bool) -> ProviderReply:
        """POST body to the upstream's route; its answer once its headers came, or the route's
        error for an upstream that could not be reached, refused llmgw's credential or is
        busy. The credential goes in its protocol's header, nowhere else."""
        up = model.upstream
        assert up is not None
        _check_url(model, up)
        url = f"{up.url}/{route.path}"
        headers = self._headers(model, up, stream)
        deadline = asyncio.get_running_loop().time() + self.deadline_s
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._client().post(
                    url, data=body, headers=headers, allow_redirects=False,
                    **self._egress.request_kw(url),
                )  # fmt: skip
        except TimeoutError:
            raise errors.upstream_timeout(
                "The model's external provider did not answer in time."
            ) from None
        except aiohttp.ClientError as e:
            log.warning(
                "provider of %s at %s unreachable: %s", model.name, up.url, type(e).__name__
            )
            raise errors.upstream_failed(
                "The model's external provider could not be reached."
            ) from None
        refusal = self._refusal(model, up, response)
        if refusal is not None:
            response.close()
            raise refusal
        return ProviderReply(response, deadline)

    def _refusal(
        self, model: Model, up: ModelUpstream, response: aiohttp.ClientResponse
    ) -> errors.ApiError | None:
        """The route's error for an answer that is not the client's to see, else None."""
        status = response.status
        if status in _REFUSED_US or 300 <= status < 400 or status == 404:
            log.warning("provider of %s at %s answered %d (llmgw's credential or settings)",
                        model.name, up.url, status)  # fmt: skip
            return errors.upstream_failed(
                f"The external provider of model '{errors.quote(model.name)}' refused llmgw's "
                "request (its credential or settings); staff can check them."
            )
        if status in _BUSY:
            message = f"The external provider of model '{errors.quote(model.name)}' is busy."
            return errors.model_busy(message, self._retry_after(response))
        return None

    def _retry_after(self, response: aiohttp.ClientResponse) -> int:
        """The upstream's Retry-After in whole seconds (bounded), else the router's."""
        value = response.headers.get("retry-after", "")
        if value.isdigit():
            return min(max(int(value), 1), _MAX_RETRY_AFTER_S)
        return self._retry_after_s

    def _headers(self, model: Model, up: ModelUpstream, stream: bool) -> dict[str, str]:
        credential = self._credential(model, up)
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json",
            "Accept-Encoding": "identity",
            "User-Agent": "llmgw",
        }
        if up.protocol == "anthropic":
            headers["x-api-key"] = credential
            headers["anthropic-version"] = ANTHROPIC_VERSION
        else:
            headers["Authorization"] = f"Bearer {credential}"
        return headers

    def _credential(self, model: Model, up: ModelUpstream) -> str:
        """The credential, opened once per sealed value (a changed one is opened anew)."""
        cached = self._opened.get((model.name, up.credential))
        if cached is not None:
            return cached
        try:
            plain = self._credentials.open(model.name, up.credential)
        except CredentialError as e:
            log.error("model %s: %s", model.name, e)
            raise errors.upstream_failed(
                f"The credential of model '{errors.quote(model.name)}' cannot be used here."
            ) from None
        if len(self._opened) > 256:
            self._opened.clear()
        self._opened[(model.name, up.credential)] = plain
        return plain

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # trust_env off: the egress proxy is the site's setting, passed per request. No cap
            # on connections: one waiting for a pooled one would wait unbounded (total=None);
            # the keys' limits and the client port's connection caps bound them instead.
            # The resolver drops link-local addresses (a name pointed at a metadata service).
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, resolver=GuardedResolver())
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, trust_env=False
            )
        return self._session


def upstream_body(doc: dict[str, Any], model: Model, route: Route, cache_key: str = "") -> None:
    """The body names the upstream's model, not the catalog's. OpenAI's chat takes the limit
    the router wrote (token_bounds) as max_completion_tokens: its reasoning models refuse
    max_tokens, and the others read either. OpenAI's chat and Responses are told not to store
    the exchange (Responses stores by default), whatever the client asked, and given
    cache_key (CacheIsolation.provider_key; "": none) as prompt_cache_key."""
    up = model.upstream
    assert up is not None
    doc["model"] = up.model
    if up.protocol != "openai" or route.path not in _STORED:
        return
    if route.path == "chat/completions" and "max_tokens" in doc:
        doc["max_completion_tokens"] = doc.pop("max_tokens")
    doc["store"] = False
    if cache_key:
        doc["prompt_cache_key"] = cache_key
