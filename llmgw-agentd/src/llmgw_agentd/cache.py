"""The node's model cache: a set's files fetched from the mirror, checked, linked by path."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import shutil
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import aiohttp

from llmgw import download, sources
from llmgw.blobstore import BlobStore, BlobStoreError, ChecksumMismatch, DiskFull
from llmgw.wire import HeldFile, ModelFile, ReplicaSpec

log = logging.getLogger(__name__)

FILES_PATH = "/mirror/files/"  # on the control plane's cluster port
PARALLEL = 4  # files of one set fetched at once
SHA256_RE = re.compile(r"[0-9a-f]{64}")


class FetchError(Exception):
    """A set cannot be made whole now; the message is the replica's failure reason."""


@dataclass(frozen=True)
class Mirror:
    """Where files come from: the linked control plane's cluster port, then the others'
    (a file one lacks or one that cannot be reached), with the link's mutual TLS."""

    url: str  # https://HOST:7710
    ssl: ssl.SSLContext | None = None
    others: tuple[str, ...] = ()  # the other control planes' cluster ports, tried in turn

    @property
    def urls(self) -> list[str]:
        """Every control plane to ask, the linked one first."""
        return [self.url, *(u for u in self.others if u != self.url)]


Progress = Callable[[str], None]  # the replica's "starting" message


class Cache:
    """root/blobs/<sha256> (a BlobStore, fetched through one Downloads) and root/sets/
    <org>--<repo>/<commit>/<path>: symlinks named by the files' repository paths."""

    def __init__(
        self,
        root: Path,
        mirror: Callable[[], Mirror],
        *,
        on_change: Callable[[], None] | None = None,
        retry_s: float = 5.0,
        tick_s: float = 1.0,
    ) -> None:
        self.root = root
        self.store = BlobStore(root)
        self.sets = root / "sets"
        self.sets.mkdir(mode=0o755, exist_ok=True)
        os.chmod(self.sets, 0o755)  # noqa: S103 (engines' dynamic users read the links)
        self._mirror = mirror
        self._on_change = on_change
        self._retry_s = retry_s  # while the mirror lacks a file
        self._tick_s = tick_s  # how often a fetch's progress is told
        self._downloads = download.Downloads(self.store)
        self._session: aiohttp.ClientSession | None = None

    def held(self) -> list[HeldFile]:
        """The checked files the cache holds (a Holdings message's list)."""
        return self.store.held()

    def set_dir(self, spec: ReplicaSpec) -> Path:
        """Where spec's set is linked; FetchError for a source that names no pinned set."""
        try:
            src = sources.parse_hf(spec.source)
        except sources.SourceError as e:
            raise FetchError(f"source {spec.source!r}: {e}") from None
        if not src.is_pinned:
            raise FetchError(f"source {spec.source!r}: not pinned to a commit")
        return self.sets / src.repo.replace("/", "--") / src.revision

    def _set_dir_of(self, spec: ReplicaSpec) -> Path | None:
        with contextlib.suppress(FetchError):
            return self.set_dir(spec)
        return None

    async def ensure(self, spec: ReplicaSpec, progress: Progress | None = None) -> Path:
        """spec's set, every file fetched from the mirror and checked, as a directory of
        links by path; raises FetchError (disk full, a file that does not check...)."""
        where = self.set_dir(spec)
        files = [_checked(f) for f in spec.files]
        self._make_dirs()
        missing = [f for f in files if not self.store.has(f.sha256)]
        if missing:
            self._check_space(missing)
            await self._fetch_all(missing, files, progress)
        await asyncio.to_thread(self._link, where, files)
        return where

    def _make_dirs(self) -> None:
        """blobs/, partial/ and sets/ made again where they are gone: a disk mounted over the
        cache while the agent runs starts empty."""
        for d in (self.store.blobs, self.store.partials, self.sets):
            if not d.is_dir():
                d.mkdir(mode=0o755, parents=True, exist_ok=True)
                os.chmod(d, 0o755)  # noqa: S103 (engines' dynamic users read the files)

    async def _fetch_all(
        self, missing: list[ModelFile], files: list[ModelFile], progress: Progress | None
    ) -> None:
        mirror = self._where()
        limit = asyncio.Semaphore(PARALLEL)
        waiting: set[str] = set()

        async def one(f: ModelFile) -> None:
            async with limit:
                await self._fetch(mirror, f, waiting)

        ticker = asyncio.create_task(self._tell(files, missing, waiting, progress))
        try:
            await asyncio.gather(*(one(f) for f in missing))
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker

    async def _fetch(self, mirror: Mirror, f: ModelFile, waiting: set[str]) -> None:
        """One file, waiting (and asking again) while no control plane has it yet."""
        while True:
            try:
                if await self._from_any(mirror, f):
                    break
                waiting.add(f.sha256)
                await asyncio.sleep(self._retry_s)
                continue
            except ChecksumMismatch as e:
                _keep_last_refused(self.store, f.sha256)
                raise FetchError(f"the mirror's copy does not check: {e}") from None
            except DiskFull as e:
                raise FetchError(f"disk full on {self.root}: {e}") from None
            except BlobStoreError as e:
                raise FetchError(f"cannot fetch {f.path}: {e}") from None
        waiting.discard(f.sha256)
        self._changed()

    async def _from_any(self, mirror: Mirror, f: ModelFile) -> bool:
        """One file from the first control plane that has it; False when each that answered
        lacks it (404); FetchError when none answered but with another failure."""
        urls = mirror.urls
        failure: download.DownloadError | None = None
        lacking = False
        for url in urls:
            try:
                # Fewer tries where another control plane can be asked: a partial is resumed.
                tries = {"attempts": 3} if len(urls) > 1 else {}
                await self._downloads.get(
                    self._http(), f"{url}{FILES_PATH}{f.sha256}", f, ssl=mirror.ssl, **tries
                )
                return True
            except download.DownloadError as e:
                if e.status == 404:
                    lacking = True
                else:
                    failure = e
        if lacking or failure is None:
            return False
        raise FetchError(f"cannot fetch {f.path} from the mirror: {failure}")

    async def _tell(
        self,
        files: list[ModelFile],
        missing: list[ModelFile],
        waiting: set[str],
        progress: Progress | None,
    ) -> None:
        """The whole set's progress, every tick_s, while it is fetched."""
        if progress is None:
            return
        said = ""
        while True:
            text = self._progress(files, missing, waiting)
            if text != said:
                progress(text)
                said = text
            await asyncio.sleep(self._tick_s)

    def _progress(self, files: list[ModelFile], missing: list[ModelFile], waiting: set[str]) -> str:
        """The whole set's progress, not the file in flight's: "fetching 2 files: 45%, 1.2 of
        2.6 GB"."""
        total = sum(f.size for f in files)
        done = total - sum(f.size for f in missing)
        for f in missing:
            if self.store.has(f.sha256):
                done += f.size
            else:
                now = self._downloads.progress(f.sha256)
                done += now[0] if now is not None else 0
        left = sum(1 for f in missing if not self.store.has(f.sha256))
        plural = "file" if left == 1 else "files"
        text = f"fetching {left} {plural}: {_percent(done, total)}, {_of(done, total)}"
        checking = [f.path for f in missing if self._downloads.verifying(f.sha256)]
        if checking:  # a resumed partial's bytes hashed again before the fetch goes on
            text += "; verifying " + ", ".join(checking[:2]) + (" ..." if len(checking) > 2 else "")
        if waiting:
            text += f"; waiting for the mirror, which does not have {len(waiting)} yet"
        return text

    def _check_space(self, missing: list[ModelFile]) -> None:
        """DiskFull for the whole set before any byte of it is fetched."""
        need = 0
        for f in missing:
            try:
                have = self.store.partial(f.sha256).stat().st_size
            except FileNotFoundError:
                have = 0
            need += max(0, f.size - have)
        free = self.store.free()
        if need > free:
            raise FetchError(
                f"disk full on {self.root}: needs {_size(need)} more, {_size(free)} free"
            )

    def _where(self) -> Mirror:
        try:
            return self._mirror()
        except Exception as e:
            raise FetchError(f"cannot reach the mirror: {e}") from None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    def _link(self, where: Path, files: list[ModelFile]) -> None:
        """The set's directory: a link per file, by its path, to its blob (relative)."""
        for f in files:
            link = where.joinpath(*PurePosixPath(f.path).parts)
            _mkdirs(link.parent, self.sets)
            target = os.path.relpath(self.store.path(f.sha256), link.parent)
            with contextlib.suppress(FileNotFoundError):
                if os.readlink(link) == target:
                    continue
            tmp = link.with_name(f".{link.name}.{secrets.token_hex(4)}.tmp")
            os.symlink(target, tmp)
            os.replace(tmp, link)

    # Sweeps

    async def sweep(
        self, remove: Iterable[str], keep: Iterable[ReplicaSpec], dry_run: bool
    ) -> None:
        """Delete the listed blobs that no spec in keep uses, the set directories of sets none
        wants (links only: never what they point at) and unwanted partial files."""
        if not dry_run:
            await asyncio.to_thread(self._sweep, set(remove), list(keep))
            self._changed()

    def _sweep(self, remove: set[str], keep: list[ReplicaSpec]) -> None:
        used = {f.sha256 for spec in keep for f in spec.files}
        wanted = {self._set_dir_of(spec) for spec in keep if spec.files}
        freed = 0
        for sha in remove - used:
            with contextlib.suppress(ValueError):
                freed += self.store.remove(sha)
        for repo in list(self.sets.iterdir()):
            for commit in list(repo.iterdir()) if repo.is_dir() else []:
                if commit not in wanted:
                    _remove_tree(commit)
            with contextlib.suppress(OSError):
                repo.rmdir()  # when empty
        for part in self.store.partials.glob("*.part"):
            key = part.name.removesuffix(".part")
            if key not in used and self._downloads.progress(key) is None:
                part.unlink(missing_ok=True)
        log.info("cache swept: %d bytes of files freed", freed)

    def _changed(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception:
                log.exception("the cache's on_change callback failed")

    async def close(self) -> None:
        """Stop fetching (partials stay, carried on by the next agent) and disconnect."""
        await self._downloads.close()
        if self._session is not None:
            await self._session.close()
            self._session = None


def _checked(f: ModelFile) -> ModelFile:
    """A file the cache can take: a sha256, and a path that stays inside the set."""
    parts = PurePosixPath(f.path).parts
    if not f.sha256 or not SHA256_RE.fullmatch(f.sha256):
        raise FetchError(f"{f.path}: no sha256 to fetch and check it by")
    if not parts or f.path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise FetchError(f"{f.path!r} is not a path inside a repository")
    return f


def _mkdirs(path: Path, top: Path) -> None:
    """path and its parents up to top, 0755 (engines' dynamic users walk them)."""
    if path == top or path.is_dir():
        return
    _mkdirs(path.parent, top)
    with contextlib.suppress(FileExistsError):
        path.mkdir()
    os.chmod(path, 0o755)  # noqa: S103


def _remove_tree(path: Path) -> None:
    """A set's directory: links are removed as links (rmtree never follows them)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def _keep_last_refused(store: BlobStore, sha256: str) -> None:
    """One refused copy of a file is kept (to look at), not one per try."""
    refused = sorted(store.partials.glob(f"{sha256}*.refused"), key=lambda p: p.stat().st_mtime)
    for old in refused[:-1]:
        old.unlink(missing_ok=True)


def _percent(done: int, total: int) -> str:
    return f"{100 * done // total}%" if total else "100%"


def _of(done: int, total: int) -> str:
    """Bytes done of a total, in the unit that suits the total: "1.2 of 2.6 GB"."""
    unit, scale = next((u, s) for u, s in _UNITS if total >= s / 10 or s == 1)
    if scale == 1:
        return f"{done} of {total} bytes"
    return f"{done / scale:.1f} of {total / scale:.1f} {unit}"


def _size(n: int) -> str:
    unit, scale = next((u, s) for u, s in _UNITS if n >= s or s == 1)
    return f"{n} bytes" if scale == 1 else f"{n / scale:.1f} {unit}"


_UNITS = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3), ("bytes", 1))
