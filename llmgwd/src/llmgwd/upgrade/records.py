"""Where the roll and the staged packages are kept: /upgrade/roll and /upgrade/packages/SHA256,
every control plane reading the same (a new leader carries the roll on)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from llmgw.api_types import StagedPackage, UpgradeRoll
from llmgwd.store import Store
from llmgwd.store.base import Compare, Put, prefix_end

ROLL = "/upgrade/roll"
PACKAGES = "/upgrade/packages/"

_roll = msgspec.json.Decoder(UpgradeRoll)
_package = msgspec.json.Decoder(StagedPackage)


async def staged(store: Store) -> list[StagedPackage]:
    """Every staged package, by name then kind."""
    kvs, _ = await store.range(PACKAGES, prefix_end(PACKAGES))
    return sorted((_package.decode(kv.value) for kv in kvs), key=lambda p: (p.name, p.kind))


async def stage(store: Store, package: StagedPackage) -> None:
    """Record a package (its bytes are in the mirror's blob store by its sha256)."""
    await store.put(PACKAGES + package.sha256, msgspec.json.encode(package))


async def roll(store: Store) -> tuple[UpgradeRoll | None, int]:
    """The roll and its key's mod revision (0: none)."""
    kv = await store.get(ROLL)
    return (_roll.decode(kv.value), kv.mod_revision) if kv is not None else (None, 0)


async def change(store: Store, how: Callable[[UpgradeRoll | None], UpgradeRoll]) -> UpgradeRoll:
    """Apply how to the roll by compare-and-set (asked again while another writer wins); how
    raises to refuse."""
    while True:
        current, revision = await roll(store)
        new = how(current)
        ok = await put_if(store, new, revision)
        if ok:
            return new


async def put_if(store: Store, new: UpgradeRoll, revision: int) -> bool:
    """Write the roll if its key is still at revision (0: absent); False when it is not."""
    held = Compare(ROLL, "mod", "=", revision) if revision else Compare(ROLL, "version", "=", 0)
    result = await store.txn([held], [Put(ROLL, msgspec.json.encode(new))])
    return result.succeeded
