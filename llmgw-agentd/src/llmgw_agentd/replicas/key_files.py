"""Engines' API keys on disk: one file a replica, readable by root only, which systemd
passes to the engine's unit as a credential."""

from __future__ import annotations

import os
from pathlib import Path

from llmgw.wire import ReplicaSpec


class KeyFiles:
    """The key files of one directory (RUNTIME_DIR/keys), <replica id>.key each."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, replica_id: str) -> Path:
        return self.directory / f"{replica_id}.key"

    def write(self, spec: ReplicaSpec) -> None:
        """The API key, readable by root only (systemd passes it on as a credential); no
        file for a spec without a key."""
        path = self.path(spec.id)
        if not spec.api_key:
            path.unlink(missing_ok=True)
            return
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(spec.api_key + "\n")
        os.replace(tmp, path)

    def remove(self, replica_id: str) -> None:
        self.path(replica_id).unlink(missing_ok=True)
