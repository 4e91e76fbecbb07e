"""The mirror's files looked for on disk every CHECK_S: a file of a set that was whole and is
gone (deleted outside the mirror: by hand, a disk tool) is said in the log and fetched again
(from another control plane, a peer's copy or upstream, as any fetch is)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

from llmgw import sources
from llmgw.wire import ModelFile
from llmgwd.catalog import Catalog
from llmgwd.mirror.service import Mirror

log = logging.getLogger(__name__)

CHECK_S = 60.0  # how often the disk is looked at


def model_sets(catalog: Catalog) -> dict[str, list[ModelFile]]:
    """The catalog's sets from the hub (or the mirror's own), each once, with its files."""
    return {m.source: list(m.files) for m in catalog.all() if sources.is_hf(m.source) and m.files}


def gone(mirror: Mirror, files: Iterable[ModelFile]) -> list[ModelFile]:
    """The files of a set that are not on the mirror's disk now."""
    return [f for f in files if f.sha256 and not mirror.store.has(f.sha256)]


class DiskCheck:
    """Remembers which sets were whole on disk; one that lost a file is fetched again."""

    def __init__(self, mirror: Mirror, catalog: Catalog) -> None:
        self._mirror = mirror
        self._catalog = catalog
        self._whole: set[str] = set()  # sources seen whole at the last look

    async def look(self) -> list[str]:
        """One look at the disk; the files found deleted, as "SOURCE: PATH"."""
        found: list[str] = []
        sets = model_sets(self._catalog)
        self._whole &= set(sets)  # a model removed: its set is no longer looked after
        for source, files in sets.items():
            missing = gone(self._mirror, files)
            if not missing:
                self._whole.add(source)
            elif source in self._whole:
                self._whole.discard(source)
                found += [f"{source}: {f.path}" for f in missing]
                await self._again(source, files, missing)
        return found

    async def _again(
        self, source: str, files: list[ModelFile], missing: Sequence[ModelFile]
    ) -> None:
        names = ", ".join(f.path for f in missing[:8]) + (", ..." if len(missing) > 8 else "")
        log.warning(
            "mirror: %d file(s) of %s deleted outside the mirror (%s); fetching them again",
            len(missing), source, names,
        )  # fmt: skip
        if self._mirror.fleet is not None:
            await self._mirror.fleet.lost(source)  # the others no longer copy it from here
        self._mirror.fetch(source, files)

    async def run(self, every_s: float = CHECK_S) -> None:
        """Look every every_s, for ever (a look that fails is logged; the next one tries)."""
        while True:
            try:
                await self.look()
            except Exception:
                log.exception("mirror: looking at the disk failed")
            await asyncio.sleep(every_s)
