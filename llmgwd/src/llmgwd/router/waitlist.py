"""Requests waiting for a free slot: one bounded first-in, first-out line per model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Literal

from llmgwd.nodes.pool import Endpoint

QUEUE_SIZE = 256  # requests waiting per model before the next is refused at once
QUEUE_TIMEOUT_S = 30.0  # how long one waits for a slot before it is refused


class Busy(Exception):
    """Every replica of the model is full: the line is full too, or the wait was too long."""

    def __init__(self, model: str, why: Literal["full", "timeout"]) -> None:
        super().__init__(f"{model}: {why}")
        self.model = model
        self.why = why


class Waiter:
    """One request in line; its future gets the replica whose slot was kept for it."""

    __slots__ = ("exclude", "future", "need")

    def __init__(
        self, exclude: frozenset[str], future: asyncio.Future[Endpoint], need: int = 0
    ) -> None:
        self.exclude = exclude  # replica ids it already tried
        self.future = future
        self.need = need  # the least context a replica must run with to take it (0: any)


class Waitlist:
    """The waiting requests of each model, in arrival order, at most size per model."""

    def __init__(self, size: int = QUEUE_SIZE) -> None:
        self._size = size
        self._lines: dict[str, dict[Waiter, None]] = {}  # dicts keep order; O(1) removal

    def count(self, model: str) -> int:
        """How many requests for model are waiting."""
        return len(self._lines.get(model, ()))

    def join(self, model: str, exclude: frozenset[str], need: int = 0) -> Waiter:
        """A new waiter at the end of model's line; Busy when the line is full."""
        line = self._lines.setdefault(model, {})
        if len(line) >= self._size:
            raise Busy(model, "full")
        waiter = Waiter(exclude, asyncio.get_running_loop().create_future(), need)
        line[waiter] = None
        return waiter

    def leave(self, model: str, waiter: Waiter) -> None:
        """Take waiter out of the line (no matter if it already left)."""
        line = self._lines.get(model)
        if line is None:
            return
        line.pop(waiter, None)
        if not line:
            del self._lines[model]

    def waiting(self, model: str) -> Iterator[Waiter]:
        """model's waiters, first come first (a copy: the caller may make them leave)."""
        return iter(list(self._lines.get(model, ())))
