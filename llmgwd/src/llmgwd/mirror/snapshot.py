"""A repository at one commit as the mirror knows it, and what the hub server reads it through."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgspec

from llmgw.wire import ModelFile


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Every file of a repository at one commit (all directories), with sizes and checksums.

    Files of a snapshot resolved from the hub may lack a sha256 (the hub gives one for LFS
    files only); the mirror records it once it has fetched and checked the file."""

    repo: str  # "ORG/REPO"
    commit: str  # 40 hex digits
    files: list[ModelFile] = []
    last_modified: str = ""  # ISO 8601, as the hub says; "" when not known
    gated: bool = False  # the upstream wants a token for it
    # Where it came from: "" the upstream, "import" `llmgw mirror import`, else the /hf URL of
    # the peer it was copied from. A ref of a set not from the upstream is the mirror's own.
    origin: str = ""

    def file(self, path: str) -> ModelFile | None:
        """The file at a path, if the snapshot has it."""
        for f in self.files:
            if f.path == path:
                return f
        return None


@dataclass(frozen=True, slots=True)
class Scope:
    """What one caller of /hf may read: every snapshot whole (sets None: staff, a node's peer),
    or of the snapshots named (repo, commit) only the files named (a user key: its models' sets).
    """

    sets: Mapping[tuple[str, str], frozenset[str]] | None = None

    def view(self, snap: Snapshot | None) -> Snapshot | None:
        """The snapshot as this caller sees it (its files narrowed), or None: hidden from it."""
        if snap is None or self.sets is None:
            return snap
        paths = self.sets.get((snap.repo, snap.commit))
        if paths is None:
            return None
        return msgspec.structs.replace(snap, files=[f for f in snap.files if f.path in paths])


EVERY = Scope()


class SnapshotSource(Protocol):
    """What the mirror holds, as the hub server (/hf) reads it."""

    def snapshot(self, repo: str, revision: str) -> Snapshot | None:
        """The snapshot a commit or a ref the mirror knows ("main", a tag) names; None if none."""
        ...

    def blob(self, sha256: str) -> Path | None:
        """The published (checked) file with this sha256, or None if the mirror lacks it."""
        ...
