"""What each node's model cache holds, as its agent last said (wire.Holdings); sweeps' answers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.wire import HeldFile

_Waiter = asyncio.Future[list[HeldFile] | None]


@dataclass
class _Held:
    files: list[HeldFile]
    stale: bool = False  # its agent disconnected since: the list is its last word
    sweep: str = ""  # the id of the last Sweep this list answered ("": none)


class Holdings:
    """Each node's cache as its agent reports it: after every new connection, whenever it
    changes, and in answer to a Sweep.

    A node that disconnects keeps its last list, marked stale (its cache is on its disk and
    most likely still holds it); a node removed from the cluster is dropped."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Held] = {}
        self._waiters: dict[tuple[str, str], list[_Waiter]] = {}

    def update(self, node: str, files: Sequence[HeldFile], sweep_id: str = "") -> None:
        """A Holdings message from node's agent; wakes whoever waits for this sweep's answer."""
        held = self._nodes.setdefault(node, _Held([]))
        held.files, held.stale = list(files), False
        if sweep_id:
            held.sweep = sweep_id
            self._wake((node, sweep_id), list(files))

    def of(self, node: str) -> list[HeldFile] | None:
        """What node holds, as it last said (see stale()); None if it never said."""
        held = self._nodes.get(node)
        return list(held.files) if held is not None else None

    def stale(self, node: str) -> bool:
        """Whether node's list predates its current connection (it is disconnected)."""
        held = self._nodes.get(node)
        return held is not None and held.stale

    def nodes(self) -> list[str]:
        """The nodes that have said what they hold, by name."""
        return sorted(self._nodes)

    def holders(self, sha256: str) -> list[str]:
        """The nodes whose last list has this file."""
        return sorted(n for n, h in self._nodes.items() if any(f.sha256 == sha256 for f in h.files))

    def forget(self, node: str) -> None:
        """node's agent disconnected: its list is kept, marked stale."""
        held = self._nodes.get(node)
        if held is not None:
            held.stale = True

    def drop(self, node: str) -> None:
        """node was removed from the cluster: nothing of it is kept; its waiters get None."""
        self._nodes.pop(node, None)
        for key in [k for k in self._waiters if k[0] == node]:
            self._wake(key, None)

    async def swept(
        self,
        node: str,
        sweep_id: str,
        timeout: float,  # noqa: ASYNC109 (each node's answer has its own bound)
    ) -> list[HeldFile] | None:
        """node's list as it answered the Sweep sweep_id (what it holds after it); None if
        no answer came within timeout seconds (or the node was removed meanwhile)."""
        held = self._nodes.get(node)
        if held is not None and held.sweep == sweep_id:
            return list(held.files)  # answered already
        waiter: _Waiter = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault((node, sweep_id), [])
        waiters.append(waiter)
        try:
            return await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            return None
        finally:
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters and self._waiters.get((node, sweep_id)) is waiters:
                del self._waiters[(node, sweep_id)]

    def _wake(self, key: tuple[str, str], files: list[HeldFile] | None) -> None:
        for waiter in self._waiters.pop(key, []):
            if not waiter.done():
                waiter.set_result(files)
