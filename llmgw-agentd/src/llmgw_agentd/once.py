"""One run of a long job (an engine's install, a build) for every replica that waits for it,
in the background, its progress told to each of them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")
Progress = Callable[[str], None]  # a replica's "starting" message; "" clears it


class _Run:
    """A job running: its task, who waits for it, and the last thing it said."""

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.waiting: list[Progress] = []
        self.last = ""

    def tell(self, text: str) -> None:
        self.last = text
        for progress in list(self.waiting):
            progress(text)


_runs: dict[str, _Run] = {}


async def run(key: str, job: Callable[[Progress], Awaitable[T]], progress: Progress | None) -> T:
    """job's result, job started once for key: a caller that comes while it runs waits for
    the same run (told what it last said, then each step); a caller that goes away (its
    replica removed) leaves it running for the others and for the cache. Each caller's
    message is cleared when the run ends; its error is every caller's."""
    current = _runs.get(key)
    if current is None:
        current = _runs[key] = _Run()
        current.task = asyncio.create_task(_job(key, current, job), name=f"once {key}")
        current.task.add_done_callback(_read)  # an error nobody waits for is not "unread"
    if progress is not None:
        current.waiting.append(progress)
        if current.last:
            progress(current.last)
    assert current.task is not None
    try:
        result: T = await asyncio.shield(current.task)
        return result
    finally:
        if progress is not None:
            current.waiting.remove(progress)
            progress("")


async def _job(key: str, current: _Run, job: Callable[[Progress], Awaitable[T]]) -> T:
    try:
        return await job(current.tell)
    finally:
        if _runs.get(key) is current:
            del _runs[key]  # the next caller starts again (after a failure, a new try)


def _read(task: asyncio.Task[Any]) -> None:
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.exception()
