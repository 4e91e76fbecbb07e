"""`llmgw mirror import DIR --as ORG/REPO`: uploaded files checked and published, then recorded
as a snapshot of ORG/REPO as if it came from the hub."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator

from llmgw import sources
from llmgw.api_types import ImportIn
from llmgw.blobstore import BlobStore, ChecksumMismatch
from llmgw.wire import ModelFile
from llmgwd.mirror.records import Records
from llmgwd.mirror.snapshot import Snapshot

CHUNK = 1 << 20
IMPORTED = "import"  # a Snapshot's origin: made here from a local directory


class ImportRefused(ValueError):
    """An import that cannot be recorded (the message is safe to show)."""


async def receive(store: BlobStore, sha256: str, size: int, body: AsyncIterator[bytes]) -> int:
    """Write an uploaded file into the store, checked against its sha256 and size before it
    is published; returns its size. A file the store holds already is read and dropped.
    Two uploads of one file at once: the second is refused (BlobStoreError)."""
    if store.has(sha256):
        async for _ in body:
            pass
        return size
    store.check_space(size)
    with store.writer(f"upload-{sha256}", size) as w:
        w.restart()  # an upload always comes whole
        async for chunk in body:
            if w.done + len(chunk) > size:
                break
            await asyncio.to_thread(w.write, chunk)
        if w.done != size or w.sha256() != sha256:
            got, digest = w.done, w.sha256()
            w.restart()
            raise ChecksumMismatch(
                f"the upload was {got} bytes or more with sha256 {digest[:16]}..., "
                f"not {size} bytes with {sha256[:16]}...: nothing published"
            )
        store.publish(w.path, sha256)  # while locked: no other upload truncates it first
    return size


def commit_of(body: ImportIn) -> str:
    """An imported set's commit: 40 hex digits made from its files, the same for the same set."""
    h = hashlib.sha1(b"llmgw-import\0", usedforsecurity=False)  # a name, as git's are
    for f in sorted(body.files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.size}\0{f.sha256}\n".encode())
    return h.hexdigest()


def check(body: ImportIn, store: BlobStore) -> None:
    """Every file named, checked: a sane path, each once, held by the store at its size."""
    if not sources.REPO_RE.fullmatch(body.repo) or ".." in body.repo or "--" in body.repo:
        raise ImportRefused(f"{body.repo!r} is not a repository name (ORG/REPO)")
    if not sources.REV_RE.fullmatch(body.revision) or sources.COMMIT_RE.fullmatch(body.revision):
        raise ImportRefused(f"{body.revision!r} is not a branch or tag name")
    if not body.files:
        raise ImportRefused("an import needs at least one file")
    seen: set[str] = set()
    for f in body.files:
        parts = f.path.split("/")
        if f.path in seen or any(p in ("", ".", "..") for p in parts) or not f.path.isprintable():
            raise ImportRefused(
                f"{f.path!r} is not a file's path inside a repository (or is twice)"
            )
        seen.add(f.path)
        if store.size(f.sha256) != f.size:
            raise ImportRefused(
                f"{f.path}: not uploaded (no file of {f.size} bytes with its sha256)"
            )
        if f.git_oid and not sources.COMMIT_RE.fullmatch(f.git_oid):
            raise ImportRefused(f"{f.path}: git_oid is not 40 hex digits")


async def record(body: ImportIn, store: BlobStore, records: Records) -> Snapshot:
    """Record the import as ORG/REPO at its commit, and the revision (main) naming it."""
    check(body, store)
    files = [ModelFile(f.path, f.size, f.sha256, f.git_oid) for f in body.files]
    files.sort(key=lambda f: f.path)
    snap = Snapshot(
        repo=body.repo,
        commit=commit_of(body),
        files=files,
        last_modified=_now_iso(),
        origin=IMPORTED,
    )
    await records.put_snapshot(snap, body.revision)
    return snap


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
