"""Files written whole or not at all, through a new file of a random name beside them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write(path: Path, data: bytes, *, mode: int = 0o600, uid: int = -1, gid: int = -1) -> None:
    """Write path atomically, its owner (uid, gid; -1 keeps ours) and mode set before its
    first byte, through a new file of a random name in its directory (mkstemp: O_EXCL,
    O_NOFOLLOW, 0600), so no link another user planted beside it is followed; the rename
    replaces a link at path itself, never its target. The new file goes if anything fails."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            if uid != -1 or gid != -1:
                os.fchown(f.fileno(), uid, gid)  # before fchmod: a chown clears set-id bits
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
