"""The mirror: resolves hf: sources to pinned sets, fetches them once, and says what it holds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from llmgw import download, proxy, sources
from llmgw.api_types import MirrorStatus, PeerView, SetStatus
from llmgw.blobstore import BlobStore, BlobStoreError, ChecksumMismatch
from llmgw.config import ConfigError
from llmgw.sources import HfSource
from llmgw.wire import ModelFile
from llmgwd.mirror import hub_client
from llmgwd.mirror.fleet import Fleet
from llmgwd.mirror.hub_client import HubError
from llmgwd.mirror.jobs import SetJob
from llmgwd.mirror.node_files import FILES
from llmgwd.mirror.records import Records
from llmgwd.mirror.snapshot import Snapshot

log = logging.getLogger(__name__)

KEEP_FINISHED_S = 3600.0  # a finished set stays in the status this long
RETRY_FIRST_S, RETRY_MAX_S = 30.0, 1800.0  # a failed set's next try: 30 s, doubling, to 30 min


class MirrorError(Exception):
    """What the mirror cannot do (the message is safe to show: no token, no URL query)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Settings:
    """The mirror's part of server.yaml, resolved."""

    dir: Path
    upstream: str
    token_file: str = ""
    parallel: int = 4
    route: proxy.Route = proxy.DIRECT  # the hub's and peers' proxy; never another plane's
    ca_file: str = ""  # the CAs the upstream's and peers' certificates chain to; "": the system's


def upstream_tls(ca_file: str) -> ssl.SSLContext | bool:
    """How the upstream's and peers' certificates are checked: against the CAs in ca_file
    (mirror.ca_file) alone, or the system's (True) when it is empty. A file that cannot be
    read or holds no CA is a ConfigError (llmgwd exits 78)."""
    if not ca_file:
        return True
    try:
        return ssl.create_default_context(cafile=ca_file)
    except OSError as e:  # ssl.SSLError too: no CA in it
        raise ConfigError(f"mirror.ca_file {ca_file}: {e.strerror or e}") from None


class Mirror:
    """The mirror's files (a BlobStore), its records (snapshots, refs, peers), its jobs."""

    def __init__(self, settings: Settings, records: Records) -> None:
        self.settings = settings
        self.records = records
        self.store = BlobStore(settings.dir)
        self.downloads = download.Downloads(self.store)
        self._jobs: dict[str, SetJob] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._by_key: dict[str, asyncio.Task[None]] = {}  # a set's fetch, by its job's key
        self._session: aiohttp.ClientSession | None = None
        self._on_done: list[Callable[[str, list[ModelFile]], None]] = []
        self.models_use: Callable[[], set[str]] = set  # the sha256s the catalog's models use
        # Several control planes (on etcd): each set fetched upstream once, copied by the
        # others from one that has it (their cluster ports, with this TLS); None: one alone.
        self.fleet: Fleet | None = None
        self.plane_tls: ssl.SSLContext | None = None

    async def start(self) -> None:
        """Read the records; open the upstream session (its TLS: upstream_tls)."""
        tls = upstream_tls(self.settings.ca_file)
        await self.records.load()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=120)
        connector = aiohttp.TCPConnector(ssl=tls)
        self._session = aiohttp.ClientSession(
            timeout=timeout, auto_decompress=False, connector=connector
        )

    async def close(self) -> None:
        """Stop the jobs; close the session (partial files stay for the next start)."""
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t
        if self._session is not None:
            await self._session.close()

    def on_done(self, listener: Callable[[str, list[ModelFile]], None]) -> None:
        """Call listener(source, files) when a set has been fetched whole."""
        self._on_done.append(listener)

    # SnapshotSource, for /hf and the nodes.

    def snapshot(self, repo: str, revision: str) -> Snapshot | None:
        """The snapshot a commit or a known ref names."""
        commit = revision if sources.COMMIT_RE.fullmatch(revision) else None
        commit = commit or self.records.ref(repo, revision)
        return self.records.snapshot(repo, commit) if commit else None

    def blob(self, sha256: str) -> Path | None:
        """The published file with this sha256."""
        try:
            return self.store.path(sha256) if self.store.has(sha256) else None
        except ValueError:
            return None

    # Adding a set.

    async def resolve(self, src: HfSource) -> Snapshot:
        """The snapshot a source names. A commit recorded here, or a ref of a set imported
        or copied from a peer, is the mirror's own; a ref of the upstream's is asked again
        (the newest commit of a branch), and the commit it named last is used only when the
        upstream cannot be reached."""
        known = self.snapshot(src.repo, src.revision)
        if known is not None and (src.is_pinned or known.origin):
            return known
        try:
            snap = await hub_client.resolve(
                self.http(),
                self.settings.upstream,
                src.repo,
                src.revision,
                token=self._token(),
                route=self.settings.route,
            )
        except HubError as e:
            if known is not None and e.status == 0:
                log.warning(
                    "mirror: %s; %s@%s taken as last resolved, %s",
                    e,
                    src.repo,
                    src.revision,
                    known.commit[:12],
                )
                return known
            raise MirrorError(str(e), 502 if e.status == 0 or e.status >= 500 else 400) from None
        await self.records.put_snapshot(
            _merge(self.records.snapshot(snap.repo, snap.commit), snap), src.revision
        )
        return self.records.snapshot(snap.repo, snap.commit) or snap

    async def add(self, src: HfSource) -> tuple[HfSource, list[ModelFile]]:
        """Pin a source, fetch its small files now (so every file has a sha256), and start
        fetching the rest; returns the pinned source and its files."""
        snap = await self.resolve(src)
        chosen = set(sources.select([f.path for f in snap.files], src.pattern))
        files = [f for f in snap.files if f.path in chosen]
        if not files:
            what = f"the pattern {src.pattern!r} matches" if src.pattern else "there is"
            raise MirrorError(f"{src.repo}@{snap.commit[:12]}: {what} no file to serve")
        several = [] if src.pattern else sources.several_ggufs([f.path for f in files])
        if several:
            names = ", ".join(several[:8]) + (", ..." if len(several) > 8 else "")
            raise MirrorError(
                f"{src.repo} holds several GGUF models ({names}): name one with "
                f"hf:{src.repo}@{src.revision}:PATTERN, such as :*{several[0].rsplit('/', 1)[-1]}"
            )
        pinned = src.pinned(snap.commit)
        unsummed = [f for f in files if not f.sha256]
        if unsummed:
            job = SetJob(snap.repo, snap.commit, unsummed, self.settings.parallel)
            try:
                done = {f.path: f for f in await self._run(job)}
            except (BlobStoreError, HubError, download.DownloadError) as e:
                raise MirrorError(f"{src.repo}@{snap.commit[:12]}: {e}", 502) from None
            files = [done.get(f.path, f) for f in files]
            await self._record_sums(snap, files)
        self.fetch(str(pinned), files)
        return pinned, files

    def fetch(self, source: str, files: list[ModelFile]) -> None:
        """Fetch a pinned set in the background unless it is whole or already in flight."""
        src = sources.parse_hf(source)
        key = f"{src.repo}@{src.revision}:{src.pattern}"
        running = self._by_key.get(key)
        if running is not None and not running.done():
            return  # fetching, or waiting to try again
        missing = [f for f in files if not (f.sha256 and self.store.has(f.sha256))]
        if not missing:
            if self.fleet is not None:
                self._spawn(self.fleet.mark(source))  # the others may copy it from here
            return
        job = SetJob(src.repo, src.revision, files, self.settings.parallel)
        self._jobs[key] = job
        self._by_key[key] = self._spawn(self._background(job, source))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _background(self, job: SetJob, source: str) -> None:
        """Fetch a set; a failure that may pass (the upstream away, a full disk) is tried
        again, less and less often; a file that does not check waits for a person."""
        wait = RETRY_FIRST_S
        while True:
            try:
                files = await self._obtain(job, source)
                break
            except ChecksumMismatch as e:
                log.error("mirror: %s@%s: %s", job.repo, job.commit[:12], e)
                return
            except (MirrorError, BlobStoreError, HubError, download.DownloadError) as e:
                job.error = f"{e}; trying again in {wait:.0f} s"
                log.error("mirror: %s@%s: %s", job.repo, job.commit[:12], job.error)
            except Exception as e:  # the store, with several control planes
                job.error = f"{type(e).__name__}; trying again in {wait:.0f} s"
                log.exception("mirror: %s@%s", job.repo, job.commit[:12])
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_S)
        log.info("mirror: %s@%s fetched whole (%d files)", job.repo, job.commit[:12], len(files))
        for listener in self._on_done:
            listener(source, files)

    async def _obtain(self, job: SetJob, source: str) -> list[ModelFile]:
        """The set from upstream; with several control planes, through the fleet (from
        another control plane that holds it, or from upstream by the one that claims it)."""
        if self.fleet is None:
            return await self._run(job)
        files = await self.fleet.obtain(source, job.files, lambda plane: self._run(job, plane))
        await self.records.load()  # the snapshot another control plane recorded
        return files

    async def _run(self, job: SetJob, plane: str | None = None) -> list[ModelFile]:
        """Fetch the set's files from upstream, or by sha256 from the control plane whose
        cluster port is at plane (mutual TLS)."""
        token = None if plane else self._token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # Another control plane's cluster port is inside the cluster: never through a proxy.
        extra: dict[str, Any] = (
            {"ssl": self.plane_tls, "attempts": 3} if plane else {"route": self.settings.route}
        )
        session = self.http()

        async def one(
            f: ModelFile, progress: Callable[[int], None], verifying: Callable[[bool], None]
        ) -> str:
            if plane:
                url = f"{plane}{FILES}{f.sha256}"
            else:
                url = hub_client.resolve_url(self.settings.upstream, job.repo, job.commit, f.path)
            return await self.downloads.get(
                session, url, f, headers=headers, progress=progress, verifying=verifying, **extra
            )

        return await job.run(one)

    async def _record_sums(self, snap: Snapshot, files: Iterable[ModelFile]) -> None:
        sums = {f.path: f.sha256 for f in files if f.sha256}
        new = [
            msgspec.structs.replace(f, sha256=f.sha256 or sums.get(f.path, "")) for f in snap.files
        ]
        await self.records.put_snapshot(msgspec.structs.replace(snap, files=new))

    # What it holds.

    def files_in_use(self) -> set[str]:
        """Files a model or a recorded snapshot names."""
        snaps = {f.sha256 for s in self.records.snapshots() for f in s.files if f.sha256}
        return snaps | self.models_use()

    def status(self) -> MirrorStatus:
        """The mirror's figures and its sets in flight (or finished within the hour)."""
        held = self.store.held()
        fs = os.statvfs(self.settings.dir)
        return MirrorStatus(
            dir=str(self.settings.dir),
            upstream=self.settings.upstream,
            files_held=len(held),
            bytes_held=sum(h.size for h in held),
            free_bytes=fs.f_bavail * fs.f_frsize,
            sets=self.sets(),
            peers=[
                PeerView(url=p.url, last_sync=p.last_sync, last_error=p.last_error)
                for p in self.records.peers()
            ],
        )

    def sets(self) -> list[SetStatus]:
        """Sets in flight, and those finished within the hour."""
        now = time.time()
        for key, job in list(self._jobs.items()):
            if job.state != "fetching" and now - job.finished_at > KEEP_FINISHED_S:
                del self._jobs[key]
        return [j.status() for j in self._jobs.values()]

    def set_status(self, source: str) -> SetStatus | None:
        """The job of one pinned source, if there is or was one."""
        src = sources.parse_hf(source)
        job = self._jobs.get(f"{src.repo}@{src.revision}:{src.pattern}")
        return job.status() if job is not None else None

    def http(self) -> aiohttp.ClientSession:
        """The session to the upstream and peers."""
        if self._session is None:
            raise MirrorError("the mirror is not started", 503)
        return self._session

    def _token(self) -> str | None:
        return hub_client.read_token(self.settings.token_file) if self.settings.token_file else None


def _merge(known: Snapshot | None, new: Snapshot) -> Snapshot:
    """A snapshot resolved again keeps the sha256s recorded for files the hub gives none."""
    if known is None:
        return new
    sums = {f.path: f.sha256 for f in known.files if f.sha256}
    files = [
        f if f.sha256 else msgspec.structs.replace(f, sha256=sums.get(f.path, ""))
        for f in new.files
    ]
    return msgspec.structs.replace(new, files=files)
