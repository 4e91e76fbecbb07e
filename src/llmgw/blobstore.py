"""A directory of checked files named by sha256: partial downloads, publish, refuse, remove."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import secrets
from pathlib import Path

from llmgw.wire import HeldFile

_SHA256 = re.compile(r"[0-9a-f]{64}")
_KEY = re.compile(r"[0-9a-z][0-9a-z-]{0,79}")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
COPY_CHUNK = 1 << 20


class BlobStoreError(Exception):
    """A store operation failed; the message names paths and sizes only."""


class DiskFull(BlobStoreError):
    """The filesystem has no room for the bytes a file needs."""


class ChecksumMismatch(BlobStoreError):
    """A file's bytes are not the ones expected: it was refused and kept aside."""


def git_blob_id(data: bytes) -> str:
    """The hub's (git's) blob id of bytes: sha1 of b"blob N\\0" + bytes."""
    h = hashlib.sha1(b"blob %d\0" % len(data), usedforsecurity=False)
    h.update(data)
    return h.hexdigest()


def git_blob_id_file(path: Path) -> str:
    """git_blob_id of a file's bytes, read in chunks."""
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size, usedforsecurity=False)
    with path.open("rb") as f:
        while chunk := f.read(COPY_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _check_sha256(sha256: str) -> str:
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"not a sha256 (64 lowercase hex): {sha256[:80]!r}")
    return sha256


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Writer:
    """Bytes written to a partial file and hashed in the same pass (sha256, and git's blob
    id when asked). Holds an exclusive lock on the partial: one writer per file.

    `done` counts the bytes already in the file (a resumed partial is read and hashed first
    by `resume`: seconds for gigabytes, so a caller on an event loop runs it in a thread). A
    full disk truncates the file back to `done` and raises DiskFull.
    """

    def __init__(self, path: Path, size: int, git_oid: bool = False) -> None:
        self.path = path
        self.size = size
        self._git = git_oid
        self.done = 0
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise BlobStoreError(f"{path} is being written by another download") from None
        self._reset_hashes()

    def _reset_hashes(self) -> None:
        self._sha256 = hashlib.sha256()
        blob = b"blob %d\0" % self.size
        self._sha1 = hashlib.sha1(blob, usedforsecurity=False) if self._git else None

    def on_disk(self) -> int:
        """Bytes in the partial file now (before a resume: the bytes it has to read)."""
        return os.fstat(self._fd).st_size

    def resume(self, limit: int | None = None) -> bool:
        """Read and hash the bytes already in the partial, at most `limit` more a call (so that
        a caller may stop between calls); True once all are counted in `done`. A partial of
        more than `size` bytes is dropped whole."""
        have = self.on_disk()
        if have > self.size:
            self.restart()
            return True
        end = have if limit is None else min(have, self.done + limit)
        os.lseek(self._fd, self.done, os.SEEK_SET)
        while self.done < end:
            chunk = os.read(self._fd, min(COPY_CHUNK, end - self.done))
            if not chunk:
                break
            self._hash(chunk)
            self.done += len(chunk)
        if self.done < have and self.done == end:
            return False
        os.ftruncate(self._fd, self.done)
        return True

    def restart(self) -> None:
        """Drop every byte written so far."""
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        self.done = 0
        self._reset_hashes()

    def _hash(self, chunk: bytes | memoryview) -> None:
        self._sha256.update(chunk)
        if self._sha1 is not None:
            self._sha1.update(chunk)

    def write(self, chunk: bytes | memoryview) -> None:
        """Append and hash one chunk (releases the GIL while hashing and writing)."""
        view = memoryview(chunk)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as e:
            if e.errno not in _NO_SPACE:
                raise
            os.ftruncate(self._fd, self.done)
            os.lseek(self._fd, self.done, os.SEEK_SET)
            raise DiskFull(
                f"no space left writing {self.path} ({self.done} of {self.size} bytes written)"
            ) from None
        self._hash(chunk)
        self.done += len(chunk)

    def sha256(self) -> str:
        return self._sha256.hexdigest()

    def git_oid(self) -> str:
        """The git blob id of the bytes written (only meaningful when asked for, and when
        exactly `size` bytes were written)."""
        return self._sha1.hexdigest() if self._sha1 is not None else ""

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlobStore:
    """root/blobs/<sha256>: published, checked files (0644, read by engines' dynamic users);
    root/partial/<key>.part: files being written; root/partial/<key>[.N].refused: files whose
    bytes did not check, kept until removed on purpose."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs"
        self.partials = root / "partial"
        root.mkdir(mode=0o755, parents=True, exist_ok=True)
        for d in (self.blobs, self.partials):
            d.mkdir(mode=0o755, exist_ok=True)
            # Engines run as systemd dynamic users and must read the blobs.
            os.chmod(d, 0o755)  # noqa: S103

    def path(self, sha256: str) -> Path:
        return self.blobs / _check_sha256(sha256)

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def size(self, sha256: str) -> int | None:
        try:
            return self.path(sha256).stat().st_size
        except FileNotFoundError:
            return None

    def held(self) -> list[HeldFile]:
        """Every published blob (anything else in blobs/ is ignored)."""
        files = []
        with os.scandir(self.blobs) as it:
            for entry in it:
                if _SHA256.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                    files.append(HeldFile(sha256=entry.name, size=entry.stat().st_size))
        return sorted(files, key=lambda f: f.sha256)

    def usage(self) -> int:
        """Bytes of published blobs, apparent sizes, each inode once (as `du -sb` counts
        the files; du adds the directory's own few KiB)."""
        seen: set[tuple[int, int]] = set()
        total = 0
        with os.scandir(self.blobs) as it:
            for entry in it:
                if _SHA256.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                    st = entry.stat()
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        total += st.st_size
        return total

    def partial(self, key: str) -> Path:
        """Where a file being fetched is written: key is its sha256, or "git-<40hex>"."""
        if not _KEY.fullmatch(key):
            raise ValueError(f"not a partial key: {key[:80]!r}")
        return self.partials / f"{key}.part"

    def writer(self, key: str, size: int, git_oid: bool = False) -> Writer:
        """A locked Writer on partial(key), bytes already there not yet read."""
        return Writer(self.partial(key), size, git_oid)

    def publish(self, partial: Path, sha256: str) -> Path:
        """Make a checked partial the blob `sha256`: synced, then renamed in at once (never
        a half-written file under blobs/). A blob already there wins; the partial goes."""
        dest = self.path(sha256)
        if dest.exists():
            partial.unlink(missing_ok=True)
            return dest
        try:
            fd = os.open(partial, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fchmod(fd, 0o644)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(partial, dest)
            _fsync_dir(self.blobs)
        except OSError as e:
            if e.errno in _NO_SPACE:
                raise DiskFull(f"no space left publishing {dest}") from None
            raise
        return dest

    def refuse(self, partial: Path) -> Path:
        """Set aside a file whose bytes did not check: partial/<key>.refused (or .N.refused
        beside an older one). Kept: never published, reused, or deleted by a download."""
        key = partial.name.removesuffix(".part")
        dest = self.partials / f"{key}.refused"
        n = 1
        while dest.exists():
            n += 1
            dest = self.partials / f"{key}.{n}.refused"
        os.rename(partial, dest)
        _fsync_dir(self.partials)
        return dest

    def refused(self) -> list[Path]:
        """The files set aside by refuse, oldest name first."""
        return sorted(self.partials.glob("*.refused"))

    def remove(self, sha256: str) -> int:
        """Delete a published blob; the bytes freed (apparent size), 0 if it was absent."""
        path = self.path(sha256)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        _fsync_dir(self.blobs)
        return size

    def remove_partials(self, keep: set[str]) -> int:
        """Delete partial and refused files whose key is not in keep; the bytes freed."""
        freed = 0
        for path in list(self.partials.iterdir()):
            key = path.name.split(".", 1)[0]
            if key in keep or not path.name.endswith((".part", ".refused")):
                continue
            with contextlib.suppress(FileNotFoundError):
                size = path.stat().st_size
                path.unlink()
                freed += size
        return freed

    def free(self) -> int:
        """Bytes an unprivileged writer may still use on the store's filesystem."""
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    def check_space(self, need_bytes: int) -> None:
        """Raise DiskFull when the filesystem has fewer than need_bytes free."""
        free = self.free()
        if need_bytes > free:
            raise DiskFull(f"needs {need_bytes} bytes more on {self.root}, {free} free")

    def ingest(self, src: Path, expect_sha256: str = "", expect_git_oid: str = "") -> HeldFile:
        """Copy a local file in, hashed while copied, checked against what is expected, and
        published (`llmgw mirror import`). A mismatch is refused and raises ChecksumMismatch."""
        size = src.stat().st_size
        if expect_sha256 and self.size(expect_sha256) == size:
            return HeldFile(sha256=expect_sha256, size=size)
        key = expect_sha256 or (f"git-{expect_git_oid}" if expect_git_oid else "")
        key = key or f"import-{secrets.token_hex(16)}"
        self.check_space(size)
        with self.writer(key, size, git_oid=bool(expect_git_oid)) as w:
            w.restart()
            with src.open("rb") as f:
                while chunk := f.read(COPY_CHUNK):
                    w.write(chunk)
            bad = mismatch(str(src), w, expect_sha256, expect_git_oid)
            if bad:
                kept = self.refuse(w.path)
                raise ChecksumMismatch(f"{bad}; kept as {kept}")
            sha = w.sha256()
            self.publish(w.path, sha)
        return HeldFile(sha256=sha, size=w.done)


def mismatch(name: str, w: Writer, sha256: str, git_oid: str) -> str:
    """What does not check in a Writer's bytes (size, then each checksum asked), in words;
    "" when all does."""
    if w.done != w.size:
        return f"{name}: expected {w.size} bytes, got {w.done}"
    if sha256 and w.sha256() != sha256:
        return f"{name}: sha256 expected {sha256}, got {w.sha256()}"
    if git_oid and w.git_oid() != git_oid:
        return f"{name}: git blob id expected {git_oid}, got {w.git_oid()}"
    return ""
