"""The mirror across control planes: each set fetched from upstream once, copied by the others."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import aiohttp

from llmgw import download
from llmgw.api_types import HeldSet
from llmgw.wire import ModelFile
from llmgwd.mirror.holders import Holders

log = logging.getLogger(__name__)

WAIT_S = 2.0  # how often a control plane waiting for another's upstream fetch looks again

# Fetch a set's files from a control plane's cluster port (its URL), or from upstream (None).
Run = Callable[[str | None], Awaitable[list[ModelFile]]]


class Fleet:
    """How a control plane gets a set: copied from a live control plane that holds it whole;
    else fetched from upstream by whoever claims it (the claim has the claimant's lease: a
    dead claimant's claim goes when its lease does and a waiting control plane takes over);
    else waited for. Every control plane that has a set whole records it (Holders.mark)."""

    def __init__(self, holders: Holders, wait_s: float = WAIT_S) -> None:
        self.holders = holders
        self._wait_s = wait_s
        self._marked: set[str] = set()  # marked since this process started

    async def obtain(self, source: str, files: list[ModelFile], run: Run) -> list[ModelFile]:
        """The set's files, fetched here from another control plane or from upstream."""
        while True:
            got = await self._copy(source, files, run)
            if got is not None:
                return got
            if await self.holders.claim(source):
                try:
                    # A holder may have marked it just before letting its claim go.
                    got = await self._copy(source, files, run)
                    if got is None:
                        log.info("mirror: %s claimed here, fetched from upstream", source)
                        got = await run(None)
                    await self.mark(source)
                    return got
                finally:
                    with contextlib.suppress(Exception):
                        await self.holders.release(source)
            await asyncio.sleep(self._wait_s)

    async def mark(self, source: str) -> None:
        """This control plane holds source whole (recorded once per process)."""
        if source not in self._marked:
            await self.holders.mark(source)
            self._marked.add(source)

    async def lost(self, source: str) -> None:
        """A file of source went from this control plane's disk: it no longer says it holds
        the set whole (marked again once it has it again)."""
        await self.holders.unmark(source)
        self._marked.discard(source)

    async def swept(self, kept: set[str]) -> None:
        """After a sweep here: this control plane no longer says it holds a set not in kept
        (the sets the catalog's models use)."""
        for source, names in (await self.holders.everything()).items():
            if self.holders.name in names and source not in kept:
                await self.holders.unmark(source)
                self._marked.discard(source)

    async def held(self, sources: list[str]) -> list[HeldSet]:
        """Which control planes hold each set some control plane holds, and each of sources."""
        everything = await self.holders.everything()
        out = []
        for source in sorted(set(everything) | set(sources)):
            claimant = await self.holders.claimant(source)
            out.append(HeldSet(source=source, planes=everything.get(source, []), fetching=claimant))
        return out

    async def _copy(self, source: str, files: list[ModelFile], run: Run) -> list[ModelFile] | None:
        """The set copied from the first live holder that serves it whole; None if none."""
        if any(not f.sha256 for f in files):
            return None  # a file is asked for by its sha256
        names = [n for n in await self.holders.holders(source) if n != self.holders.name]
        if not names:
            return None
        urls = await self.holders.urls()
        for name in names:
            if name not in urls:
                continue  # not live
            try:
                got = await run(urls[name])
            except (download.DownloadError, aiohttp.ClientError, TimeoutError) as e:
                log.warning("mirror: %s not copied from %s (%s); trying another", source, name, e)
                continue
            log.info("mirror: %s copied from control plane %s", source, name)
            await self.mark(source)
            return got
        return None
