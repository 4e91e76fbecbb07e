"""Slurm's settings in the cluster (`slurm.enabled`, its name, controller, nodes, lent ones,
partition, a new leader's hold), kept in the store at /slurm/settings and checked like
every setting."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import msgspec

from llmgw import pki
from llmgw.api_types import SlurmSettingsIn as SlurmSettingsIn  # PUT /slurm's body
from llmgwd.accounting.views import Invalid
from llmgwd.nodes.members import Members
from llmgwd.store import Compare, Put, Store

SETTINGS = "/slurm/settings"
# Slurm lower-cases ClusterName and slurmdbd keeps it in table names: short and plain.
CLUSTER_RE = re.compile(r"[a-z][a-z0-9_]{0,39}")
PARTITION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
HOLD_FOR_S = 120  # slurm.hold_for's default: 2 minutes
HOLD_FOR_MAX_S = 3600


class SlurmSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Slurm's settings as stored (and as GET /api/v1/slurm shows them)."""

    enabled: bool = False
    cluster_name: str = "llmgw"
    controller: str = ""  # the node that runs slurmctld
    nodes: list[str] = []  # the nodes in Slurm (slurmd runs there)
    lent: list[str] = []  # the nodes of those lent to Slurm; the others are drained there
    partition: str = "llmgw"
    hold_for_s: int = HOLD_FOR_S  # a new leader with nothing kept waits this for the nodes
    all_nodes: bool = False  # every member runs slurmd, those joining later too (see in_slurm)


def in_slurm(settings: SlurmSettings, members: Iterable[str]) -> SlurmSettings:
    """settings with the nodes Slurm has now: with all_nodes, every member as well."""
    if not settings.all_nodes:
        return settings
    return msgspec.structs.replace(settings, nodes=sorted({*settings.nodes, *members}))


def merged(old: SlurmSettings, change: SlurmSettingsIn) -> SlurmSettings:
    """old with the fields change gives."""
    given = {
        f: v for f in change.__struct_fields__ if (v := getattr(change, f)) is not msgspec.UNSET
    }
    return msgspec.structs.replace(old, **given)


def _check_node(param: str, name: str) -> None:
    try:
        pki.check_node_name(name)
    except pki.PKIError as e:
        raise Invalid(param, f"{name!r}: {e}") from None


def check(s: SlurmSettings) -> SlurmSettings:
    """s, or Invalid naming the field at fault."""
    if not CLUSTER_RE.fullmatch(s.cluster_name):
        raise Invalid("cluster_name", "1-40 lower-case letters, digits or '_', from a letter")
    if not PARTITION_RE.fullmatch(s.partition):
        raise Invalid("partition", "1-64 letters, digits, '_', '.' or '-', from a letter or digit")
    if not 0 <= s.hold_for_s <= HOLD_FOR_MAX_S:
        raise Invalid("hold_for_s", f"0 to {HOLD_FOR_MAX_S} seconds")
    if s.controller:
        _check_node("controller", s.controller)
    for name in s.nodes:
        _check_node("nodes", name)
    if len(set(s.nodes)) != len(s.nodes):
        raise Invalid("nodes", "a node is named twice")
    if not s.all_nodes and (stray := sorted(set(s.lent) - set(s.nodes))):
        raise Invalid("lent", f"not in Slurm's nodes: {', '.join(stray)}")
    if len(set(s.lent)) != len(s.lent):
        raise Invalid("lent", "a node is named twice")
    if s.enabled and not s.controller:
        raise Invalid("controller", "Slurm on needs a controller node")
    return s


CHANGE_TRIES = 20  # a change raced this often by others is given up (Busy)


class Busy(Exception):
    """The settings kept changing under a change: it was not made."""


_dec = msgspec.json.Decoder(SlurmSettings)
_enc = msgspec.json.Encoder()


class SettingsStore:
    """Slurm's settings in the store (any control plane reads and changes them)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def get(self) -> SlurmSettings:
        """The stored settings (the defaults, Slurm off, when none are)."""
        kv = await self._store.get(SETTINGS)
        return _dec.decode(kv.value) if kv is not None else SlurmSettings()

    async def change(self, change: SlurmSettingsIn) -> SlurmSettings:
        """Apply change to the stored settings, check and store them; Invalid if they are
        wrong (a node added that has not joined the cluster, too). A change made meanwhile by
        another caller is read again, not overwritten; Busy after CHANGE_TRIES such races."""
        return await self._update(lambda old: merged(old, change))

    async def lend(self, node: str, lent: bool) -> SlurmSettings:
        """Lend node to Slurm (lent) or take it back; Invalid if Slurm is off or the node is
        not in it."""
        return await self._update(lambda old: lending_change(old, node, lent))

    async def _update(self, change: Callable[[SlurmSettings], SlurmSettings]) -> SlurmSettings:
        for _ in range(CHANGE_TRIES):
            kv = await self._store.get(SETTINGS)
            old = _dec.decode(kv.value) if kv is not None else SlurmSettings()
            new = check(change(old))
            added = {*new.nodes, *new.lent} - {*old.nodes, *old.lent}
            await self._check_joined(sorted(added))
            rev = kv.mod_revision if kv is not None else 0
            res = await self._store.txn(
                [Compare(SETTINGS, "mod", "=", rev)], [Put(SETTINGS, _enc.encode(new))]
            )
            if res.succeeded:
                return new
        raise Busy(f"Slurm's settings changed {CHANGE_TRIES} times under this change; try again")

    async def _check_joined(self, names: list[str]) -> None:
        """Invalid unless every node named is a member of the cluster."""
        members = Members(self._store)
        for name in names:
            member = await members.get(name)
            if member is None or not member.active:
                raise Invalid("nodes", f"{name!r} has not joined the cluster (llmgw node token)")


def lending_change(old: SlurmSettings, node: str, lent: bool) -> SlurmSettings:
    """old with node lent or taken back; Invalid if Slurm is off or node is not in it."""
    if not old.enabled:
        raise Invalid("enabled", "Slurm is off: `llmgw slurm setup` first")
    if node not in old.nodes and not old.all_nodes:
        raise Invalid("nodes", f"{node!r} is not one of Slurm's nodes ({', '.join(old.nodes)})")
    others = [n for n in old.lent if n != node]
    return msgspec.structs.replace(old, lent=[*others, node] if lent else others)
