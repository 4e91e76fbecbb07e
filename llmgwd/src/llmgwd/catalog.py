"""Desired state kept in the store: the model catalog, API keys and join tokens."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable
from typing import Literal, Protocol

import msgspec

# KeyLimits and Period are defined with the API's answers (GET /keys shows a key's limits).
from llmgw.api_types import KeyLimits as KeyLimits
from llmgw.api_types import Period as Period
from llmgw.api_types import ProviderProtocol
from llmgw.wire import Engine, ModelFile
from llmgwd.people.directory import USERS
from llmgwd.people.records import User
from llmgwd.placement import profiles as profiles_
from llmgwd.placement.estimate import ModelShape
from llmgwd.placement.profiles import Profile
from llmgwd.store import Compare, Delete, Get, Put, Store, prefix_end

log = logging.getLogger(__name__)

Role = Literal["user", "admin"]
KEY_PREFIX = "sk-llmgw-"
# A key's id: 12 hex digits. No key's name may look like one, so an id never names two keys.
KEY_ID = re.compile(r"[0-9a-fA-F]{12}")


def looks_like_key_id(name: str) -> bool:
    """Whether a key name could be taken for a key's id (such names are refused)."""
    return KEY_ID.fullmatch(name) is not None


class ModelUpstream(msgspec.Struct, frozen=True, kw_only=True):
    """Where an external provider's model is served: set by staff, never by a request."""

    protocol: ProviderProtocol
    url: str  # the upstream API's base, its /v1 (https://api.openai.com/v1)
    model: str  # the upstream's name of the model
    credential: str  # sealed (providers.credentials): never the credential itself


class Model(msgspec.Struct, kw_only=True):
    """A model in the catalog and how many replicas of it are wanted."""

    name: str
    source: str  # file:/path/model.gguf, or hf:ORG/REPO@COMMIT[:PATTERN] (pinned when added)
    engine: Engine = "llama.cpp"
    args: list[str] = []
    context: int = 0
    max_tokens: int = 0  # the most completion tokens one request may ask for; 0: context
    price_prompt: float = 0.0  # per million prompt tokens, in the site's currency
    price_completion: float = 0.0  # per million completion tokens
    replicas: int = 0  # with profiles: their sum
    created_at: float = 0.0
    # Fields after this one default, so records stored before them still decode.
    profiles: list[Profile] = []  # []: the one profile profiles.single() makes of the above
    shape: ModelShape | None = None  # read from its file when added; None: placed by count
    shape_error: str = ""  # why the shape could not be read (shown by `llmgw model plan`)
    on_demand: bool = False  # started by the first request, parked after idle_s without one
    idle_s: int = 300
    files: list[ModelFile] = []  # an hf: source's set, each file with its sha256; [] for file:
    # Raised by POST /models/{name}/restart: in each replica's spec, so the agents replace them.
    generation: int = 0
    upstream: ModelUpstream | None = None  # an external provider's: never placed on a node


def profiles_of(model: Model) -> list[Profile]:
    """A model's profiles: its own, or the one a model without profiles has."""
    if model.profiles:
        return list(model.profiles)
    return profiles_.single(model.engine, list(model.args), model.replicas, model.context)


class ApiKey(msgspec.Struct, kw_only=True):
    """An API key as stored: only its hash, never the key."""

    id: str
    name: str
    hash: str  # sha256 hex of the whole key
    prefix: str  # the first characters, so a person can tell keys apart
    role: Role = "user"
    created_at: float = 0.0
    revoked: bool = False
    limits: KeyLimits = msgspec.field(default_factory=KeyLimits)
    # A person's key (issue 13); "" for keys made before and for keys of no user.
    user: str = ""  # its maker's user id: the key has the maker's rights, narrowed to project
    org: str = ""
    project: str = ""  # "" with a user: a staff key (the maker's staff role)
    service: bool = False  # a project's service key, made by one of its managers
    expires_at: float = 0.0  # 0: never; a sign-in's key (llmgw login) ends then


class KeyOwner(msgspec.Struct, frozen=True, kw_only=True):
    """Whose a new key is: its maker, and the project it is narrowed to ("" for a staff key)."""

    user: str
    org: str = ""
    project: str = ""
    service: bool = False


class JoinToken(msgspec.Struct, kw_only=True):
    """A short-lived token a node joins with, stored by its hash."""

    hash: str
    expires_at: float


def hash_secret(secret: str) -> str:
    """The stored form of a key or token: keys are random, so a plain sha256 is enough."""
    return hashlib.sha256(secret.encode()).hexdigest()


def engine_key(cluster_secret: bytes, replica_id: str) -> str:
    """The API key an engine is started with: only the router (holding the secret) knows it."""
    return hmac.new(cluster_secret, b"engine:" + replica_id.encode(), hashlib.sha256).hexdigest()


MODELS = "/models/"
KEYS = "/keys/"
TOKENS = "/tokens/"

_model_dec = msgspec.json.Decoder(Model)
_key_dec = msgspec.json.Decoder(ApiKey)
_user_dec = msgspec.json.Decoder(User)
_token_dec = msgspec.json.Decoder(JoinToken)
_enc = msgspec.json.Encoder()
FOLLOW_RETRY_S = 1.0  # between a failed watch and reading the catalog again


def _why(e: Exception) -> str:
    """An error for the log: its type and message (store errors carry no key or value)."""
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


class Follower(Protocol):
    """An index of other store keys kept by the catalog's one load and watch (accounting.levels)."""

    async def load(self, store: Store) -> int:
        """Read everything it follows; returns the store's revision."""
        ...

    def watches(self, key: str) -> bool:
        """Whether it follows this store key."""
        ...

    def apply(self, key: str, value: bytes | None) -> None:
        """A put (value) or delete (None) of a key it follows."""
        ...


class CatalogError(Exception):
    """A catalog change that cannot be made (the message is safe to show the caller)."""


class Catalog:
    """Models, keys and tokens in the store, with an in-memory copy the router reads.

    The copy is loaded at start and kept current by a watch on the store, so the request
    path never waits on the store.
    """

    def __init__(self, store: Store, followers: tuple[Follower, ...] = ()) -> None:
        self._store = store
        self._followers = followers
        self._models: dict[str, Model] = {}
        self._keys_by_hash: dict[str, ApiKey] = {}
        self._keys: dict[str, ApiKey] = {}
        self._active: set[str] = set()  # users whose keys work (a deactivated one's stop)
        self._listeners: list[Callable[[], None]] = []

    @property
    def store(self) -> Store:
        """The store the catalog is kept in (the people directory keeps its records there)."""
        return self._store

    async def load(self) -> int:
        """Read everything once; returns the revision to watch from."""
        kvs, rev = await self._store.range(MODELS, prefix_end(MODELS))
        self._models = {m.name: m for m in (_model_dec.decode(kv.value) for kv in kvs)}
        kvs, rev2 = await self._store.range(KEYS, prefix_end(KEYS))
        self._set_keys([_key_dec.decode(kv.value) for kv in kvs])
        kvs, rev3 = await self._store.range(USERS, prefix_end(USERS))
        users = [_user_dec.decode(kv.value) for kv in kvs]
        self._active = set()
        for u in users:  # as the watch notes each one: a waiting user's keys do not work
            self.note_user(u)
        revs = [await f.load(self._store) for f in self._followers]
        return max(rev, rev2, rev3, *revs)

    async def follow(self, revision: int) -> None:
        """Apply the store's changes from revision on, for ever (run as a task). A watch that
        fails (its start compacted away, the store unreachable) is not the end: everything is
        read again and followed from there, so no change is ever missed for good."""
        while True:
            try:
                if revision < 0:
                    revision = await self.load()
                    self._changed()
                await self._apply(revision)
                return  # the store closed
            except Exception as e:
                log.warning("following the catalog failed (%s); reading it again", _why(e))
                revision = -1
                await asyncio.sleep(FOLLOW_RETRY_S)

    async def _apply(self, revision: int) -> None:
        """Apply each change from revision on, until the watch ends or fails."""
        async for ev in self._store.watch("/", prefix_end("/"), start_revision=revision + 1):
            key = ev.kv.key
            for f in self._followers:
                if f.watches(key):
                    f.apply(key, ev.kv.value if ev.type == "put" else None)
            if key.startswith(MODELS):
                name = key[len(MODELS) :]
                if ev.type == "put":
                    self._models[name] = _model_dec.decode(ev.kv.value)
                else:
                    self._models.pop(name, None)
            elif key.startswith(KEYS):
                keys = dict(self._keys)
                if ev.type == "put":
                    k = _key_dec.decode(ev.kv.value)
                    keys[k.id] = k
                else:
                    keys.pop(key[len(KEYS) :], None)
                self._set_keys(list(keys.values()))
            elif key.startswith(USERS) and ev.type == "put":
                self.note_user(_user_dec.decode(ev.kv.value))
            elif key.startswith(USERS):
                self._active.discard(key[len(USERS) :])
            else:
                continue
            self._changed()

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call listener after every change of models or keys."""
        self._listeners.append(listener)

    def note_user(self, user: User) -> None:
        """Keep a user's active flag (the watch calls this; so does whoever just changed it,
        so that a deactivated user's keys stop at once on this control plane)."""
        if user.active and user.approved:  # a user waiting for approval has no working key
            self._active.add(user.id)
        else:
            self._active.discard(user.id)

    def _set_keys(self, keys: list[ApiKey]) -> None:
        self._keys = {k.id: k for k in keys}
        self._keys_by_hash = {k.hash: k for k in keys if not k.revoked}

    # The router's synchronous reads (from memory).

    def get(self, name: str) -> Model | None:
        """A model by name."""
        return self._models.get(name)

    def all(self) -> list[Model]:
        """Every model, by name."""
        return [self._models[n] for n in sorted(self._models)]

    def authenticate(self, secret: str) -> ApiKey | None:
        """The live key whose hash matches secret, or None (a key is ASCII: a header's bytes
        that are not UTF-8 come as surrogates, which str.encode refuses)."""
        if not secret.startswith(KEY_PREFIX) or not secret.isascii():
            return None
        key = self._live(self._keys_by_hash.get(hash_secret(secret)))
        # Compare again in constant time: the dict lookup alone leaks nothing useful, but
        # this keeps the rule in one obvious place.
        return key if key and hmac.compare_digest(key.hash, hash_secret(secret)) else None

    def live_key(self, key_id: str) -> ApiKey | None:
        """The key with this id if it is live now (the console's session names its key by
        id, so a revoked or expired key, or a deactivated user's, ends its sessions)."""
        key = self._keys.get(key_id)
        return None if key is None or key.revoked else self._live(key)

    def _live(self, key: ApiKey | None) -> ApiKey | None:
        """key, unless its user is deactivated (or deleted) or it has expired."""
        if key is None or (key.user and key.user not in self._active):
            return None  # a deactivated (or deleted) user's keys stop
        if key.expires_at and key.expires_at <= time.time():
            return None
        return key

    def keys(self) -> list[ApiKey]:
        """Every key (revoked ones too), oldest first."""
        return sorted(self._keys.values(), key=lambda k: k.created_at)

    # Writes (through the store; the watch updates the copy).

    async def add_model(self, model: Model) -> Model:
        """Add a new model; an existing name is an error."""
        model = msgspec.structs.replace(model, created_at=model.created_at or time.time())
        res = await self._store.txn(
            [Compare(MODELS + model.name, "version", "=", 0)],
            [Put(MODELS + model.name, _enc.encode(model))],
        )
        if not res.succeeded:
            raise CatalogError(f"model {model.name!r} already exists")
        self._models[model.name] = model
        return model

    async def update_model(self, name: str, **changes: object) -> Model:
        """Change fields of a model, with compare-and-set so concurrent changes are not lost."""
        while True:
            kv = await self._store.get(MODELS + name)
            if kv is None:
                raise CatalogError(f"no model named {name!r}")
            model = msgspec.structs.replace(_model_dec.decode(kv.value), **changes)
            res = await self._store.txn(
                [Compare(kv.key, "mod", "=", kv.mod_revision)], [Put(kv.key, _enc.encode(model))]
            )
            if res.succeeded:
                self._models[name] = model
                return model

    async def remove_model(self, name: str) -> None:
        """Take a model out of the catalog."""
        count, _ = await self._store.delete(MODELS + name)
        if not count:
            raise CatalogError(f"no model named {name!r}")
        self._models.pop(name, None)

    async def create_key(
        self,
        name: str,
        role: Role = "user",
        limits: KeyLimits | None = None,
        owner: KeyOwner | None = None,
        expires_at: float = 0.0,
    ) -> tuple[ApiKey, str]:
        """A new key (its maker, project and service flag taken from owner, if given); returns
        the record and the key itself, which is never stored."""
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        key = ApiKey(
            id=secrets.token_hex(6),
            name=name,
            hash=hash_secret(secret),
            prefix=secret[: len(KEY_PREFIX) + 4],
            role=role,
            created_at=time.time(),
            limits=limits or KeyLimits(),
            expires_at=expires_at,
        )
        if owner is not None:
            key = msgspec.structs.replace(
                key, user=owner.user, org=owner.org, project=owner.project, service=owner.service
            )
        await self._store.put(KEYS + key.id, _enc.encode(key))
        self._set_keys([*self._keys.values(), key])
        return key, secret

    async def revoke_key(self, key_id: str) -> ApiKey:
        """Revoke the key with this id (never a name: the caller resolves names)."""
        return await self._change_key(key_id, revoked=True)

    async def set_key_limits(self, key_id: str, limits: KeyLimits) -> ApiKey:
        """Replace a key's limits."""
        return await self._change_key(key_id, limits=limits)

    async def _change_key(self, key_id: str, **changes: object) -> ApiKey:
        """Change fields of a stored key with compare-and-set, so two concurrent changes (a
        revoke and new limits) never undo each other."""
        while True:
            kv = await self._store.get(KEYS + key_id)
            if kv is None:
                raise CatalogError(f"no key {key_id!r}")
            key = msgspec.structs.replace(_key_dec.decode(kv.value), **changes)
            res = await self._store.txn(
                [Compare(kv.key, "mod", "=", kv.mod_revision)], [Put(kv.key, _enc.encode(key))]
            )
            if res.succeeded:
                self._set_keys([key if k.id == key.id else k for k in self._keys.values()])
                return key

    async def add_token(self, token: str, ttl_s: float) -> None:
        """Remember a join token (by its hash) until it expires."""
        lease = await self._store.lease_grant(ttl_s)
        rec = JoinToken(hash=hash_secret(token), expires_at=time.time() + ttl_s)
        await self._store.put(TOKENS + rec.hash, _enc.encode(rec), lease=lease)

    async def consume_token(self, token: str) -> bool:
        """True once for a live token: it is deleted in the same transaction that checks it."""
        key = TOKENS + hash_secret(token)
        res = await self._store.txn([Compare(key, "version", ">", 0)], [Get(key), Delete(key)])
        if not res.succeeded or not res.responses or not res.responses[0]:
            return False
        rec = _token_dec.decode(res.responses[0][0].value)
        return rec.expires_at > time.time()
