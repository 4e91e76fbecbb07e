"""/api/v1/mirror's requests and answers: the mirror's sets, imports, uploads, sweeps and peers."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from llmgw.sources import REPO_RE, REV_RE, SHA256_RE

# What the handlers check, said in the types (and so in /api/v1/openapi.json).
Repo = Annotated[
    str,
    msgspec.Meta(
        pattern=rf"^(?!.*(?:--|\.\.))(?:{REPO_RE.pattern})$",
        description="must be a repository name, ORG/REPO",
    ),
]
Revision = Annotated[
    str, msgspec.Meta(pattern=f"^(?:{REV_RE.pattern})$", description="must be a branch or tag")
]
Sha256 = Annotated[
    str,
    msgspec.Meta(pattern=f"^{SHA256_RE.pattern}$", description="must be 64 lowercase hex digits"),
]
PeerUrl = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^https?://[^/?#@\s]+(?:/[^?#\s]*)?$",
        description="must be an http(s):// URL of a mirror's /hf",
    ),
]

SetState = Literal["fetching", "done", "failed"]


class SetStatus(msgspec.Struct, kw_only=True):
    """A model's set as the mirror fetches it: the whole set's figures, not one file's."""

    repo: str
    commit: str
    files: int  # in the set
    files_done: int
    bytes_total: int
    bytes_done: int
    rate_bytes_s: float = 0.0  # over the last seconds
    eta_s: float | None = None  # None: not known yet (or done)
    state: SetState = "fetching"
    current: list[str] = []  # paths in flight
    verifying: list[str] = []  # paths being checked (a resumed file's bytes hashed again)
    error: str = ""


class PeerView(msgspec.Struct, kw_only=True):
    """Another mirror this one copies from."""

    url: str
    last_sync: float = 0.0
    last_error: str = ""
    # Added on a mirror alone: how a control plane's operator copies from this machine
    as_peer: str = ""


class HeldSet(msgspec.Struct, kw_only=True):
    """A model's set among several control planes: which hold it whole, which fetches it."""

    source: str  # hf:ORG/REPO@COMMIT[:PATTERN]
    planes: list[str] = []  # the control planes holding it whole, by name
    fetching: str = ""  # the control plane fetching it from upstream now ("": none)


class MirrorStatus(msgspec.Struct, kw_only=True):
    """GET /mirror: what the mirror holds and what it is fetching."""

    dir: str
    upstream: str
    files_held: int
    bytes_held: int
    free_bytes: int
    sets: list[SetStatus] = []
    peers: list[PeerView] = []
    held: list[HeldSet] = []  # several control planes (on etcd) only


class ImportFile(msgspec.Struct, frozen=True):
    """One file of a directory being imported, uploaded before the import is recorded."""

    path: str
    size: Annotated[int, msgspec.Meta(ge=0)]
    sha256: Sha256
    git_oid: str = ""  # given for files that would not be in LFS on the hub (small, text)


class ImportIn(msgspec.Struct, frozen=True):
    """POST /mirror/import: a directory's files (each uploaded already) as ORG/REPO@main."""

    repo: Repo
    files: Annotated[list[ImportFile], msgspec.Meta(min_length=1)]
    revision: Revision = "main"


class ImportOut(msgspec.Struct, frozen=True):
    """The snapshot an import made."""

    repo: str
    commit: str
    revision: str
    files: int
    bytes: int


class SweepIn(msgspec.Struct, frozen=True):
    """POST /mirror/sweep."""

    dry_run: bool = False


class NodeSweep(msgspec.Struct, kw_only=True):
    """What one node deleted, from its own lists before and after (or would delete)."""

    node: str
    files: int  # no longer listed (dry run: would go)
    bytes: int
    kept: int = 0  # files asked to go that the node kept (a replica of its uses them)
    answered: bool = True  # False: not connected, or no new list in time; figures are 0


class SweepOut(msgspec.Struct, kw_only=True):
    """What a sweep freed (or, with dry_run, would free)."""

    dry_run: bool
    files: int  # on the mirror
    bytes: int
    paths: list[str] = []  # the mirror's files that went (or would go), as sha256s
    nodes: list[NodeSweep] = []


class PeerIn(msgspec.Struct, frozen=True):
    """POST /mirror/peers."""

    url: PeerUrl
    token_file: str = ""


class UploadView(msgspec.Struct, kw_only=True):
    """PUT /mirror/uploads/{sha256}: one file of an import, received and checked."""

    sha256: str
    size: int
