"""Whether a replica the control plane wants may enter this node, checked once as it enters."""

from __future__ import annotations

import re
from collections.abc import Callable

from llmgw.wire import Inventory, ReplicaSpec
from llmgw_agentd import devices, engines
from llmgw_agentd.engines import EngineError

# A replica's id names its unit, its record and its key file.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def valid_id(replica_id: str) -> bool:
    """Whether replica_id may name a unit and files: letters, digits, '.', '_' and '-'."""
    return _ID.fullmatch(replica_id) is not None


def check(spec: ReplicaSpec, inventory: Callable[[], Inventory]) -> None:
    """Refuse, before any unit exists, a spec that could never start here: its id, its engine
    (source, args), and its cards (not on this node, or below what its engine needs; the
    inventory read only for a spec on cards); raises EngineError saying why."""
    if not valid_id(spec.id):
        raise EngineError(f"replica id {spec.id!r}: use letters, digits, '.', '_' and '-'")
    engines.check(spec)
    if spec.devices:
        devices.check(spec, inventory())
