"""Who may read the mirror through /hf, and what: any live llmgw key, as huggingface_hub sends
HF_TOKEN; staff see every set, a user key only the sets of the models it may use."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmgw.sources import SourceError, is_hf, parse_hf
from llmgw.wire import ModelFile
from llmgwd.api.base import KeyLookup
from llmgwd.mirror.hub_server import SCOPE
from llmgwd.mirror.snapshot import EVERY, Scope

if TYPE_CHECKING:
    from llmgwd.catalog import ApiKey

log = logging.getLogger(__name__)

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="llmgw"'}


class Backed(Protocol):
    """A catalog model as the scope reads it: its name, source and set."""

    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def files(self) -> Sequence[ModelFile]: ...


class Models(Protocol):
    """The catalog's models."""

    def all(self) -> Iterable[Backed]:
        """Every model."""
        ...


class Scopes(Protocol):
    """What a key may see of the mirror."""

    async def of(self, key: ApiKey) -> Scope:
        """The key's scope (EVERY for staff)."""
        ...


class KeyScopes:
    """A staff key sees every set; another key the sets (repository, commit and files) of
    the catalog's models it may use, as the router decides it (Meter.allows)."""

    def __init__(
        self,
        models: Models,
        allows: Callable[[ApiKey, str], bool],
        is_staff: Callable[[ApiKey], Awaitable[bool]],
    ) -> None:
        self._models = models
        self._allows = allows
        self._is_staff = is_staff

    async def of(self, key: ApiKey) -> Scope:
        """The key's scope, from the catalog as it is now."""
        if await self._is_staff(key):
            return EVERY
        sets: dict[tuple[str, str], set[str]] = {}
        for model in self._models.all():
            if not is_hf(model.source) or not self._allows(key, model.name):
                continue
            try:
                src = parse_hf(model.source)  # pinned when added: its revision is the commit
            except SourceError:
                continue
            sets.setdefault((src.repo, src.revision), set()).update(f.path for f in model.files)
        return Scope({k: frozenset(v) for k, v in sets.items()})


def _refuse(message: str) -> web.Response:
    # The hub's own shape: {"error": ...} with X-Error-Message; huggingface_hub shows it.
    headers = {**_CHALLENGE, "X-Error-Message": message}
    return web.json_response({"error": message}, status=401, headers=headers)


def key_auth(keys: KeyLookup, scopes: Scopes) -> Middleware:
    """A user or admin key as `Authorization: Bearer KEY` (HF_TOKEN=sk-llmgw-...); the request
    then sees what scopes says the key may."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return _refuse("an llmgw key is needed: set HF_TOKEN to it")
        key = keys.authenticate(secret.strip())
        if key is None:
            return _refuse("the key is not valid (or was revoked)")
        request[SCOPE] = await scopes.of(key)
        return await handler(request)

    return middleware
