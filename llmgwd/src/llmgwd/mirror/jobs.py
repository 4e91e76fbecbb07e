"""One set's download on the mirror: its files several at once, with the whole set's progress."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from llmgw.api_types import SetState, SetStatus
from llmgw.wire import ModelFile

log = logging.getLogger(__name__)

# file, progress (the file's bytes written so far), verifying (True while a resumed partial's
# bytes are hashed again, False after) -> the sha256 published
FetchOne = Callable[[ModelFile, Callable[[int], None], Callable[[bool], None]], Awaitable[str]]
RATE_WINDOW_S = 10.0


@dataclass(slots=True)
class _File:
    file: ModelFile
    done: int = 0
    state: str = "queued"  # queued, fetching, done, failed
    verifying: bool = False


class SetJob:
    """Fetch a set's files, `parallel` at once; the first failure fails the set (the others
    already fetched stay published: they checked, and a retry will not fetch them again)."""

    def __init__(self, repo: str, commit: str, files: list[ModelFile], parallel: int) -> None:
        self.repo = repo
        self.commit = commit
        self._files = [_File(f) for f in files]
        self._parallel = max(1, parallel)
        self._samples: deque[tuple[float, int]] = deque()
        self.state: SetState = "fetching"
        self.error = ""
        self.finished_at = 0.0

    @property
    def files(self) -> list[ModelFile]:
        """The set's files, with the sha256 each was published under once done."""
        return [f.file for f in self._files]

    async def run(self, fetch_one: FetchOne) -> list[ModelFile]:
        """Fetch every file (again, after a failure: what was fetched is not); raises the
        first failure."""
        self.state, self.error = "fetching", ""
        sem = asyncio.Semaphore(self._parallel)
        failure: Exception | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                for f in self._files:
                    tg.create_task(self._one(f, fetch_one, sem))
        except* Exception as group:
            failure = group.exceptions[0]
        if failure is not None:
            # Raised here, not inside except*: Python would wrap it in an ExceptionGroup,
            # which the callers' except clauses (ChecksumMismatch, DownloadError...) miss.
            self.state, self.error = "failed", str(failure)
            self.finished_at = time.time()
            raise failure
        self.state, self.finished_at = "done", time.time()
        return self.files

    async def _one(self, f: _File, fetch_one: FetchOne, sem: asyncio.Semaphore) -> None:
        async with sem:
            f.state = "fetching"

            def progress(done: int) -> None:
                # A resumed file starts at its partial's size: only new bytes make the rate.
                if f.done:
                    self._samples.append((time.monotonic(), max(0, done - f.done)))
                f.done = done

            def verifying(on: bool) -> None:
                f.verifying = on

            try:
                sha = await fetch_one(f.file, progress, verifying)
            except BaseException:
                f.state = "failed"
                raise
            finally:
                f.verifying = False
            f.done, f.state = f.file.size, "done"
            if not f.file.sha256:
                f.file = msgspec.structs.replace(f.file, sha256=sha)

    def _rate(self) -> float:
        now = time.monotonic()
        while self._samples and self._samples[0][0] < now - RATE_WINDOW_S:
            self._samples.popleft()
        if not self._samples:
            return 0.0
        span = max(now - self._samples[0][0], 1.0)
        return sum(n for _, n in self._samples) / span

    def status(self) -> SetStatus:
        """The whole set's progress."""
        total = sum(f.file.size for f in self._files)
        done = sum(min(f.done, f.file.size) for f in self._files)
        rate = self._rate() if self.state == "fetching" else 0.0
        eta = (total - done) / rate if rate > 0 and self.state == "fetching" else None
        return SetStatus(
            repo=self.repo,
            commit=self.commit,
            files=len(self._files),
            files_done=sum(f.state == "done" for f in self._files),
            bytes_total=total,
            bytes_done=done,
            rate_bytes_s=rate,
            eta_s=eta,
            state=self.state,
            current=[f.file.path for f in self._files if f.state == "fetching"],
            verifying=[f.file.path for f in self._files if f.verifying],
            error=self.error,
        )
