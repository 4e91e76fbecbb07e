"""Files fetched over HTTP into a BlobStore: ranges to resume, retries with backoff, checked
before published, one fetch per file however many ask."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import ssl as ssl_module
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from llmgw import proxy
from llmgw.blobstore import BlobStore, ChecksumMismatch, Writer, mismatch
from llmgw.wire import ModelFile

log = logging.getLogger("llmgw.download")

# aiohttp's buffer per answer: reads of about 200 KiB to 2 MiB. Bigger ones (4 MiB) cost more
# CPU a byte (measured): a chunk no longer stays in the cache between hash and write.
READ_BUFSIZE = 1 << 20
# Hash and write each chunk in a thread while the next is read, where cores are to spare. On
# 2 cores (the server's send, the read and the hash compete) it costs more CPU a byte than it
# saves, measured with bench/mirror/download_rate.py: there the loop hashes and writes itself
# (a 1 MiB chunk holds it well under a millisecond).
OFFLOAD = len(os.sched_getaffinity(0)) > 2
# A resumed partial is read and hashed in a thread this many bytes at a time: a cancelled
# fetch waits for one step (well under a second), not for gigabytes.
VERIFY_STEP = 64 << 20
MAX_REDIRECTS = 10
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")

T = TypeVar("T")
Progress = Callable[[int], None]
Verifying = Callable[[bool], None]


class DownloadError(Exception):
    """A fetch failed for good. The message names the file, the status and the URL's host and
    path, never its query, a header or a token."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class _Retry(Exception):
    """This attempt failed in a way another attempt may not (a 5xx, a 429, a short answer)."""


class _Restart(Exception):
    """The answer cannot carry the partial on: start again from byte 0 (once)."""


def partial_key(want: ModelFile) -> str:
    """The key a file is fetched under: its sha256, else "git-" and its git blob id."""
    if want.sha256:
        return want.sha256
    if want.git_oid:
        return f"git-{want.git_oid}"
    raise ValueError(f"{want.path}: no sha256 or git blob id to check it against")


def safe_url(url: URL | str) -> str:
    """A URL as it may be shown: scheme, host, port and path; no user, password or query."""
    u = URL(url)
    port = f":{u.explicit_port}" if u.explicit_port else ""
    return f"{u.scheme}://{u.host}{port}{u.path}"


def _origin(u: URL) -> tuple[str, str, int | None]:
    return (u.scheme, u.host or "", u.port)


class _Job:
    """One file's fetch: what every attempt needs."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        writer: Writer,
        want: ModelFile,
        headers: Mapping[str, str] | None,
        progress: Progress | None,
        ssl: ssl_module.SSLContext | bool | None,
        stall_s: float,
        route: proxy.Route,
    ) -> None:
        self.session = session
        self.url = self.last_url = URL(url)
        self.route = route
        self.w = writer
        self.want = want
        self.headers: CIMultiDict[str] = CIMultiDict(headers or {})
        self.headers["Accept-Encoding"] = "identity"
        self.progress = progress
        self.extra: dict[str, Any] = {} if ssl is None else {"ssl": ssl}
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=stall_s, sock_read=stall_s)
        self.received = 0  # bytes of the file that came over the wire, every try together

    def tell(self) -> None:
        if self.progress is not None:
            self.progress(self.w.done)

    async def open(self) -> aiohttp.ClientResponse:
        """GET from w.done on, following redirects here so that Authorization stays with
        its own host; the answer that is not a redirect."""
        url, headers = self.url, self.headers.copy()
        if self.w.done:
            headers["Range"] = f"bytes={self.w.done}-"
        for _ in range(MAX_REDIRECTS + 1):
            self.last_url = url
            resp = await self.session.get(
                url,
                headers=headers,
                allow_redirects=False,
                timeout=self.timeout,
                read_bufsize=READ_BUFSIZE,
                auto_decompress=False,
                **self.extra,
                **self.route.request_kw(url),
            )
            if resp.status not in _REDIRECTS:
                return resp
            location = resp.headers.get("Location", "")
            resp.release()
            if not location:
                raise _Retry(f"{resp.status} without a Location from {safe_url(url)}")
            nxt = url.join(URL(location))
            if _origin(nxt) != _origin(url):
                headers.popall("Authorization", None)
            url = nxt
        raise DownloadError(f"{self.want.path}: more than {MAX_REDIRECTS} redirects")

    def check(self, resp: aiohttp.ClientResponse) -> None:
        """Whether the answer carries the partial on; restarts the writer on a plain 200."""
        status, where = resp.status, safe_url(resp.url)
        if status == 416:
            raise _Restart(f"416 to a range from byte {self.w.done} from {where}")
        if status in (408, 429) or status >= 500:
            raise _Retry(f"{status} {resp.reason} from {where}")
        if status not in (200, 206):
            via = proxy.answered_by_proxy(self.route, resp.url, status)
            raise DownloadError(
                f"{self.want.path}: {status} {resp.reason} from {where}{via}", status=status
            )
        if status == 200 and self.w.done:
            log.info("%s: %s answers the whole file to a range: from byte 0", self.want.path, where)
            self.w.restart()
            self.tell()
        if status == 206:
            m = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", ""))
            if not m or int(m[1]) != self.w.done or m[3] not in ("*", str(self.want.size)):
                raise _Restart(
                    f"Content-Range {resp.headers.get('Content-Range')!r}"
                    f" from {where} does not continue byte {self.w.done}"
                )
        length = resp.content_length
        if length is not None and length != self.want.size - self.w.done:
            raise _Restart(
                f"{where} answers {length} bytes from byte {self.w.done},"
                f" the file has {self.want.size}"
            )

    async def body(self, resp: aiohttp.ClientResponse) -> None:
        """Read the answer into the writer (with OFFLOAD, one chunk hashed and written in a
        thread while the next is read). Bytes received before a cut are kept."""
        loop = asyncio.get_running_loop()
        pending: asyncio.Future[None] | None = None
        cut: aiohttp.ClientPayloadError | None = None
        try:
            while not cut:
                try:
                    chunk = await resp.content.readany()
                except aiohttp.ClientPayloadError as e:
                    cut, chunk = e, _leftover(resp.content)
                if pending is not None:
                    await pending
                    pending = None
                    self.tell()
                if not chunk:
                    break
                if self.w.done + len(chunk) > self.want.size:
                    raise _Restart(f"{safe_url(resp.url)} sends more than {self.want.size} bytes")
                self.received += len(chunk)
                if OFFLOAD:
                    pending = loop.run_in_executor(None, self.w.write, chunk)
                else:
                    self.w.write(chunk)
                    self.tell()
            if pending is not None:
                await pending
                self.tell()
        finally:
            if pending is not None:
                await _settle(pending)
        if cut:
            raise cut
        if self.w.done < self.want.size:
            raise _Retry(f"the answer ended at byte {self.w.done} of {self.want.size}")

    def why(self, e: BaseException) -> str:
        """A failed attempt in words: the proxy's part said where it was the proxy's."""
        return proxy.explain(e, self.route, self.last_url) or _why(e)

    async def once(self) -> None:
        resp = await self.open()
        try:
            self.check(resp)
            await self.body(resp)
        finally:
            resp.release()


def _leftover(content: aiohttp.StreamReader) -> bytes:
    """The bytes aiohttp received before a cut but no longer hands out once it knows of the
    cut (its readany raises first): taken from its buffer, so they are not fetched again."""
    buffer = getattr(content, "_buffer", None)
    if not buffer:
        return b""
    data = b"".join(buffer)[getattr(content, "_buffer_offset", 0) :]
    buffer.clear()
    content._buffer_offset = 0
    return data


async def _settle(fut: asyncio.Future[Any]) -> None:
    """Wait for a write in a thread to end, even when cancelled meanwhile (the writer's file
    must not be closed under it); a cancellation is passed on after."""
    cancelled = False
    while not fut.done():
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:  # noqa: S110 - the caller already has the error that matters
            pass
    if cancelled:
        raise asyncio.CancelledError


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a thread. A cancellation waits for it to end first (it works on a
    writer's file, which must not be closed under it), then is passed on."""
    fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    await _settle(fut)
    return fut.result()


async def _verify(w: Writer, verifying: Verifying | None) -> int:
    """Read and hash the bytes a partial already holds, in a thread a step at a time, with
    verifying(True) before and verifying(False) after; the bytes kept."""
    if not w.on_disk():
        return 0
    if verifying is not None:
        verifying(True)
    try:
        while not await _in_thread(w.resume, VERIFY_STEP):
            pass
    finally:
        if verifying is not None:
            verifying(False)
    return w.done


def _why(e: BaseException) -> str:
    """An exception in words that carry no URL query or header."""
    if isinstance(e, _Retry | _Restart):
        return str(e)
    if isinstance(e, TimeoutError):
        return f"{type(e).__name__}: no byte within the stall time"
    if isinstance(e, aiohttp.ClientResponseError | aiohttp.InvalidURL):
        return type(e).__name__
    return f"{type(e).__name__}: {e}"


_RETRIED = (_Retry, aiohttp.ClientError, TimeoutError, ConnectionError)
_PERMANENT = (aiohttp.ClientConnectorCertificateError, aiohttp.InvalidURL)


async def _attempts(job: _Job, attempts: int, backoff_s: float) -> None:
    """Attempts until the file is whole: a failure after some progress starts the count of
    tries again; a restart from byte 0 happens once."""
    failures, restarted = 0, False
    while True:
        before = job.w.done
        try:
            await job.once()
            return
        except _Restart as e:
            if restarted:
                raise DownloadError(f"{job.want.path}: {e}") from None
            restarted = True
            log.warning("%s: %s; from byte 0 again", job.want.path, e)
            await _in_thread(job.w.restart)
            job.tell()
            continue
        except _PERMANENT as e:
            raise DownloadError(f"{job.want.path}: {job.why(e)}") from None
        except _RETRIED as e:
            why = job.why(e)
        failures = 1 if job.w.done > before else failures + 1
        if failures >= attempts:
            raise DownloadError(f"{job.want.path}: gave up after {failures} tries: {why}")
        delay = min(backoff_s * 2 ** (failures - 1), 8.0)
        log.warning(
            "%s: try %d of %d failed at byte %d (%s); again in %.1f s",
            job.want.path,
            failures,
            attempts,
            job.w.done,
            why,
            delay,
        )
        await asyncio.sleep(delay)


def _publish(store: BlobStore, w: Writer, want: ModelFile) -> str:
    """Check the whole file: publish it under its sha256, or refuse it (kept aside)."""
    bad = mismatch(want.path, w, want.sha256, want.git_oid)
    if bad:
        kept = store.refuse(w.path)
        raise ChecksumMismatch(f"{bad}; refused, kept as {kept}")
    sha = w.sha256()
    store.publish(w.path, sha)
    return sha


async def fetch(
    session: aiohttp.ClientSession,
    url: str,
    store: BlobStore,
    want: ModelFile,
    *,
    headers: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    verifying: Verifying | None = None,
    ssl: ssl_module.SSLContext | bool | None = None,
    attempts: int = 6,
    stall_s: float = 60.0,
    backoff_s: float = 0.5,
    route: proxy.Route = proxy.DIRECT,
) -> str:
    """Fetch `want` from `url` into the store, checked; the sha256 it is published under.

    A partial left by an earlier fetch is checked (its bytes read and hashed in a thread,
    verifying(True) before and verifying(False) after) and carried on with a Range.
    progress(done) is called with the bytes of the file held so far (resumed bytes included;
    0 again on a restart), after each chunk.
    route: the proxy each request (each redirect's too) goes through; DIRECT inside the
    cluster. Raises DownloadError (a 4xx, tries spent), ChecksumMismatch (refused, kept aside)
    or DiskFull.
    """
    if want.sha256 and store.has(want.sha256):
        return want.sha256
    started = time.monotonic()
    with store.writer(partial_key(want), want.size, git_oid=bool(want.git_oid)) as w:
        resumed = await _verify(w, verifying)
        job = _Job(session, url, w, want, headers, progress, ssl, stall_s, route)
        job.tell()
        store.check_space(want.size - w.done)
        if w.done < want.size:
            await _attempts(job, attempts, backoff_s)
        sha = await _in_thread(_publish, store, w, want)
    took = time.monotonic() - started
    # received: what came over the wire, every try of this fetch together; with a cut carried
    # on by a Range it is the size less what was resumed (more: bytes fetched twice).
    log.info(
        "fetched %s: %d bytes (%d resumed, %d received) in %.1f s, %.0f MB/s",
        want.path,
        want.size,
        resumed,
        job.received,
        took,
        job.received / max(took, 1e-6) / 1e6,
    )
    return sha


class Downloads:
    """One fetch per file in this process however many ask at once, with each file's
    progress for status displays. A caller cancelled does not cancel the others' fetch."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self._tasks: dict[str, asyncio.Task[str]] = {}
        self._progress: dict[str, tuple[int, int]] = {}
        self._verifying: set[str] = set()

    async def get(
        self, session: aiohttp.ClientSession, url: str, want: ModelFile, **kw: Any
    ) -> str:
        """fetch(session, url, self.store, want, **kw), shared with any caller already
        fetching the same file (its arguments win)."""
        key = partial_key(want)
        task = self._tasks.get(key)
        if task is None:
            if want.sha256 and self.store.has(want.sha256):
                return want.sha256
            task = asyncio.create_task(
                self._run(key, session, url, want, kw), name=f"fetch {want.path}"
            )
            self._tasks[key] = task
            task.add_done_callback(functools.partial(self._done, key))
        return await asyncio.shield(task)

    async def _run(
        self,
        key: str,
        session: aiohttp.ClientSession,
        url: str,
        want: ModelFile,
        kw: dict[str, Any],
    ) -> str:
        outer: Progress | None = kw.pop("progress", None)
        outer_verifying: Verifying | None = kw.pop("verifying", None)
        self._progress[key] = (0, want.size)

        def progress(done: int) -> None:
            self._progress[key] = (done, want.size)
            if outer is not None:
                outer(done)

        def verifying(on: bool) -> None:
            if on:
                self._verifying.add(key)
            else:
                self._verifying.discard(key)
            if outer_verifying is not None:
                outer_verifying(on)

        return await fetch(
            session, url, self.store, want, progress=progress, verifying=verifying, **kw
        )

    def _done(self, key: str, task: asyncio.Task[str]) -> None:
        self._tasks.pop(key, None)
        self._progress.pop(key, None)
        self._verifying.discard(key)
        if not task.cancelled():
            task.exception()  # retrieved: every caller got it already, or none is left

    def progress(self, key: str) -> tuple[int, int] | None:
        """(bytes done, size) of a file being fetched under this key; None when none is."""
        return self._progress.get(key)

    def verifying(self, key: str) -> bool:
        """Whether the file under this key is being checked: a partial's bytes read and
        hashed again before its fetch carries on."""
        return key in self._verifying

    def active(self) -> dict[str, tuple[int, int]]:
        """Every file being fetched: key -> (bytes done, size)."""
        return dict(self._progress)

    async def close(self) -> None:
        """Cancel every fetch in flight (their partials stay, to be carried on later)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
