"""Files written whole or not at all, through a new file of a random name beside them."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def writer(path: Path, *, mode: int = 0o600, uid: int = -1, gid: int = -1) -> Iterator[BinaryIO]:
    """A file to write path through, atomically: its owner (uid, gid; -1 keeps ours) and mode
    set before its first byte, a new file of a random name in path's directory (mkstemp:
    O_EXCL, O_NOFOLLOW, 0600), so no link another user planted beside it is followed; once
    the block ends it is synced and renamed to path (the rename replaces a link at path
    itself, never its target), the directory synced. If the block raises, the new file goes
    and path is as it was."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            if uid != -1 or gid != -1:
                os.fchown(f.fileno(), uid, gid)  # before fchmod: a chown clears set-id bits
            os.fchmod(f.fileno(), mode)
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    """The rename made durable: the directory's entry synced (where it can be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse a directory's fsync: the rename stands
    finally:
        os.close(fd)


def write(path: Path, data: bytes, *, mode: int = 0o600, uid: int = -1, gid: int = -1) -> None:
    """Write path atomically with data (writer(): a new file beside it, renamed)."""
    with writer(path, mode=mode, uid=uid, gid=gid) as f:
        f.write(data)
