"""Limits, budgets and model allow-lists above a key (its user, organization, team and project):
their records in the store and the in-memory index the Meter reads on each request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import msgspec

from llmgwd.accounting.level_keys import LEVELS as LEVELS  # re-exported: their home before
from llmgwd.accounting.level_keys import org_level as org_level
from llmgwd.accounting.level_keys import project_level as project_level
from llmgwd.accounting.level_keys import team_level as team_level
from llmgwd.accounting.level_keys import user_level as user_level
from llmgwd.catalog import KEYS, KeyLimits
from llmgwd.people.directory import PROJECTS
from llmgwd.people.records import Project
from llmgwd.store import Compare, Put, Store, prefix_end


class LevelLimits(msgspec.Struct, frozen=True, kw_only=True):
    """One level's limits and budgets (as a key's), and the models it may use ([]: every one)."""

    limits: KeyLimits = msgspec.field(default_factory=KeyLimits)
    models: list[str] = []


NONE = LevelLimits()
_dec = msgspec.json.Decoder(LevelLimits)
_project_dec = msgspec.json.Decoder(Project)
_enc = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Chain:
    """The levels above a key, each with its limits, and the models they all allow (None: any)."""

    levels: tuple[tuple[str, KeyLimits], ...]
    models: frozenset[str] | None


class KeyLike(msgspec.Struct):
    """What a chain is made of: a key's maker, organization and project."""

    id: str = ""
    user: str = ""
    org: str = ""
    project: str = ""


_key_dec = msgspec.json.Decoder(KeyLike)


class Owned(Protocol):
    """A key as a chain reads it (ApiKey, KeyLike)."""

    @property
    def user(self) -> str: ...
    @property
    def org(self) -> str: ...
    @property
    def project(self) -> str: ...


class Levels:
    """Every level's record and every project's team, from the store, kept current by the
    catalog's watch; chains are made once per (user, org, project) and dropped on a change."""

    def __init__(self) -> None:
        self._records: dict[str, LevelLimits] = {}
        self._teams: dict[tuple[str, str], str] = {}  # (org, project): its team ("" none)
        self._chains: dict[tuple[str, str, str], Chain] = {}
        self._keys: dict[str, KeyLike] = {}  # every key's maker, org and project, by id

    async def load(self, store: Store) -> int:
        """Read every level and project; returns the store's revision."""
        kvs, rev = await store.range(LEVELS, prefix_end(LEVELS))
        self._records = {kv.key[len(LEVELS) :]: _dec.decode(kv.value) for kv in kvs}
        kvs, rev2 = await store.range(PROJECTS, prefix_end(PROJECTS))
        projects = [_project_dec.decode(kv.value) for kv in kvs]
        self._teams = {(p.org, p.name): p.team for p in projects}
        kvs, rev3 = await store.range(KEYS, prefix_end(KEYS))
        self._keys = {k.id: k for k in (_key_dec.decode(kv.value) for kv in kvs)}
        self._chains = {}
        return max(rev, rev2, rev3)

    def watches(self, key: str) -> bool:
        """Whether a store key is one this index follows."""
        return key.startswith((LEVELS, PROJECTS, KEYS))

    def apply(self, key: str, value: bytes | None) -> None:
        """A put (value) or a delete (None) of a store key this index follows."""
        if key.startswith(KEYS):
            self._note_key(key, value)
            return
        self._chains = {}
        if key.startswith(LEVELS):
            if value is None:
                self._records.pop(key[len(LEVELS) :], None)
            else:
                self._records[key[len(LEVELS) :]] = _dec.decode(value)
        elif value is not None:
            p = _project_dec.decode(value)
            self._teams[(p.org, p.name)] = p.team
        else:
            org, _, name = key[len(PROJECTS) :].partition("/")
            self._teams.pop((org, name), None)

    def _note_key(self, key: str, value: bytes | None) -> None:
        if value is None:
            self._keys.pop(key[len(KEYS) :], None)
        else:
            k = _key_dec.decode(value)
            self._keys[k.id] = k

    def of_key_id(self, key_id: str) -> Chain:
        """The chain of a key by its id (no levels for a key not known)."""
        return self.chain(self._keys.get(key_id, KeyLike()))

    def keys_in(self, level: str) -> set[str]:
        """The ids of the keys a level holds (for the usage its budgets start from)."""
        return {i for i, k in self._keys.items() if level in (x for x, _ in self.chain(k).levels)}

    def budgeted(self) -> list[tuple[str, KeyLimits]]:
        """Every level with a token or spend budget, and its limits."""
        return [(i, r.limits) for i, r in sorted(self._records.items())
                if r.limits.budget_tokens or r.limits.budget_spend]  # fmt: skip

    def record(self, level: str) -> LevelLimits:
        """A level's record (no limits and every model when none is stored)."""
        return self._records.get(level, NONE)

    def chain(self, key: Owned) -> Chain:
        """The levels above a key: its user, organization, team and project (those it has)."""
        ident = (key.user, key.org, key.project)
        found = self._chains.get(ident)
        if found is None:
            found = self._chains[ident] = self._make(*ident)
        return found

    def _make(self, user: str, org: str, project: str) -> Chain:
        ids = [user_level(user)] if user else []
        if org:
            ids.append(org_level(org))
        team = self._teams.get((org, project), "") if project else ""
        if team:
            ids.append(team_level(org, team))
        if project:
            ids.append(project_level(org, project))
        records = [self.record(i) for i in ids]
        models: frozenset[str] | None = None
        for r in records:
            if r.models:
                models = frozenset(r.models) if models is None else models & frozenset(r.models)
        return Chain(tuple((i, r.limits) for i, r in zip(ids, records, strict=True)), models)


async def change(store: Store, level: str, record: LevelLimits) -> LevelLimits:
    """Store a level's record with compare-and-set (two changes never undo each other)."""
    key = LEVELS + level
    while True:
        kv = await store.get(key)
        guard = (
            Compare(key, "version", "=", 0)
            if kv is None
            else Compare(key, "mod", "=", kv.mod_revision)
        )
        if (await store.txn([guard], [Put(key, _enc.encode(record))])).succeeded:
            return record


async def read(store: Store, level: str) -> LevelLimits:
    """A level's stored record, or the empty one."""
    kv = await store.get(LEVELS + level)
    return NONE if kv is None else _dec.decode(kv.value)
