"""What the router may send to: the ready replicas of each model, as agents report them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One ready engine: where it listens and the key it wants."""

    replica_id: str
    model: str
    node: str
    url: str  # http://ADDRESS:PORT, from the agent's report, never from a request
    api_key: str
    priority: int = 0  # its profile's: the router fills higher ones first
    slots: int = 0  # requests it serves at once, as the engine says (0: not known)
    context: int = 0  # tokens one request may hold: the engine's, else its spec's (0: not known)


class Pool(Protocol):
    """The router's view of the cluster."""

    def ready(self, model: str) -> list[Endpoint]:
        """The replicas of model that are ready now (may be empty)."""
        ...

    def wanted(self, model: str) -> int:
        """How many replicas of model are wanted (0: the model is not served)."""
        ...
