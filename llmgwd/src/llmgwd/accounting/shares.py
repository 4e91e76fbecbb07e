"""The port between the router's Meter and the cluster's shares of each key's limits and
budgets (llmgwd.accounting.allotments implements it; the router never sees the store)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from llmgwd.accounting.budgets import Exhausted
from llmgwd.accounting.rates import Refusal
from llmgwd.catalog import KeyLimits


class Refill:
    """A request's share is short and more is being taken from the store: wait for it."""

    def __init__(self, pending: Sequence[asyncio.Future[None]]) -> None:
        self._pending = pending

    async def wait(self, timeout_s: float) -> None:
        """Until every refill is done or timeout_s passed (a failed refill is the same)."""
        await asyncio.wait(self._pending, timeout=timeout_s)


class Shares(Protocol):
    """What this control plane holds of each key's budgets and rates, spent locally."""

    wait_s: float  # how long a request waits for a refill before it is refused

    def check(
        self,
        key_id: str,
        limits: KeyLimits,
        tokens: int,
        picos: int,
        requests: int,
        day: str,
        wait: bool = True,
    ) -> Exhausted | Refusal | Refill | None:
        """None when the request fits every share now; a Refill under way (when wait) when one
        is short; the budget's or rate's refusal when the cluster has no more for it."""
        ...

    def take(
        self, key_id: str, limits: KeyLimits, tokens: int, picos: int, requests: int, day: str
    ) -> object:
        """Reserve the request on its shares; returns the ticket to settle."""
        ...

    def settle(self, ticket: object, tokens: int, picos: int) -> None:
        """Release a ticket's reservations and count what the request used."""
        ...
