"""munge's key on the node: written only when it changed, 0400 and owned by munge."""

from __future__ import annotations

import base64
import os
import pwd
from pathlib import Path

KEY = Path("/etc/munge/munge.key")


def write_key(encoded: str, path: Path = KEY, owner: str = "munge") -> bool:
    """Write the base64 key the leader sent; whether it changed (munged must then restart).
    The key is never logged nor put in an error."""
    key = base64.b64decode(encoded, validate=True)
    if len(key) < 32:
        raise ValueError("the munge key sent is shorter than munge's least (32 bytes)")
    if path.exists() and path.read_bytes() == key:
        return False
    tmp = path.with_name(path.name + ".llmgw")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    try:
        user = pwd.getpwnam(owner)
        os.chown(tmp, user.pw_uid, user.pw_gid)
    except KeyError:
        pass  # no munge user (not installed yet): root keeps it
    os.replace(tmp, path)
    return True
