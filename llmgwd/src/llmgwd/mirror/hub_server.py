"""The Hugging Face hub's protocol (at /hf) over what the mirror holds, for the official client.

`HF_ENDPOINT=http://HOST:PORT/hf HF_TOKEN=<llmgw key>` makes huggingface_hub (snapshot_download,
hf_hub_download, `hf download`) fetch from the mirror. Routes, as the hub answers them:

    GET /api/models/{org}/{repo}[/revision/{rev}]      model info; ?blobs=true: sizes and lfs
    GET /api/models/{org}/{repo}/tree/{rev}[/{path}]   entries; ?recursive=true; Link rel="next"
    GET|HEAD /{org}/{repo}/resolve/{rev}/{path}        the file's bytes (ranges), hub headers

Which files are LFS files: a file is one when the mirror holds no git blob id for it
(ModelFile.git_oid is set only for the hub's non-LFS files). An LFS file is listed with
"lfs": {"oid": its sha256, ...}; its entry's "oid" (and "blobId") is the git blob id of the pointer
file the hub stores for it, computed from the pointer text, so the same on every mirror.
Directories carry their git tree id, computed from their entries as git does. Every file entry also
carries "llmgw_sha256" (an llmgw extension) when the mirror knows the file's sha256, for another
llmgwd that uses this mirror as its upstream.

resolve answers 200 (or 206 for a Range) with the bytes itself, never a redirect, and never the xet
headers: the client then downloads over plain HTTP. Its headers: X-Repo-Commit (the pinned commit,
also for a branch name), ETag (the sha256 of an LFS file, the git blob id of another), X-Linked-Etag
and X-Linked-Size (LFS files), Content-Length, Accept-Ranges, Content-Type application/octet-stream.

Who sees what: the auth middleware sets each request's Scope (SCOPE); a key that may use only some
models sees only the snapshots backing them, narrowed to their files, and anything else is a 404
RepoNotFound, EntryNotFound or RevisionNotFound as if it did not exist (the hub's answer to a
private repository). A request with no Scope set sees every snapshot (an auth with no keys: a
stand-in upstream in tests). "gated" is always false: what a caller sees it may download.

Errors have the hub's shape: {"error": MESSAGE} with X-Error-Message, and X-Error-Code RepoNotFound,
RevisionNotFound or EntryNotFound, which the client turns into its own exceptions. Malformed input
(a repository name, revision or path the hub would never have) is a 400. A file the snapshot lists
but whose bytes the mirror does not hold yet is a 503 "not yet mirrored" with Retry-After: the
client retries a few times, then fails with that message; a 404 would be wrong, as the client
records a 404 as "this file does not exist at this commit" in its cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmgw.errors import HF, ApiError
from llmgw.sources import REPO_RE, REV_RE
from llmgw.wire import ModelFile
from llmgwd.mirror.snapshot import EVERY, Scope, Snapshot, SnapshotSource

log = logging.getLogger(__name__)

PREFIX = "/hf"  # where llmgwd mounts the app on the client port
SOURCE: web.AppKey[SnapshotSource] = web.AppKey("hub_source")
PAGE_SIZE: web.AppKey[int] = web.AppKey("hub_page_size")
SCOPE = web.RequestKey("hub_scope", Scope)  # set by the auth middleware; EVERY when not set
TREE_PAGE_SIZE = 1000  # the hub's page of a tree listing
RETRY_AFTER_S = 2  # what a 503 "not yet mirrored" asks the client to wait
MAX_PATH = 1024

_LFS_SPEC = "https://git-lfs.github.com/spec/v1"
_KEPT_HEADERS = ("Allow", "WWW-Authenticate")  # of an HTTPException, into the hub's shape
# One byte range (RFC 9110 14.1.2); the unit is case-insensitive, the digits ASCII only.
_RANGE_RE = re.compile(r"bytes=([0-9]*)-([0-9]*)", re.ASCII | re.IGNORECASE)
_CURSOR_RE = re.compile(r"[0-9]{1,12}", re.ASCII)
_FAR = 1 << 62  # a position past the end of any file (a range's number of more digits)


class HubError(ApiError):
    """An ApiError in the hub's shape (llmgw.errors.HF); the message is shown to the caller,
    the code (X-Error-Code) read by its client."""

    shape = HF

    def __init__(
        self, status: int, message: str, code: str = "", headers: dict[str, str] | None = None
    ) -> None:
        type_ = "server_error" if status >= 500 else "invalid_request_error"
        super().__init__(status, message, type_, code or None, headers=headers)


# Input.


def _repo(org: str, name: str) -> str:
    repo = f"{org}/{name}"
    if not REPO_RE.fullmatch(repo) or ".." in repo or "--" in repo:
        raise HubError(400, f"{repo!r} is not a repository name (ORG/REPO)")
    return repo


def _revision(revision: str) -> str:
    """A branch, tag or commit (aiohttp has decoded a quoted one, refs%2Fpr%2F1, once)."""
    if not REV_RE.fullmatch(revision) or ".." in revision or revision.endswith("/"):
        raise HubError(400, f"{revision!r} is not a branch, tag or commit")
    return revision


def _path(path: str) -> str:
    """A relative path inside a repository: no empty, "." or ".." part, no NUL, no backslash."""
    parts = path.split("/")
    if (
        not path
        or len(path) > MAX_PATH
        or "\0" in path
        or "\\" in path
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise HubError(400, f"{path[:MAX_PATH]!r} is not a path inside a repository")
    return path


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("1", "true")


def scope_of(request: web.Request) -> Scope:
    """What the caller may see (EVERY where the auth middleware set no Scope)."""
    scope: Scope = request.get(SCOPE, EVERY)
    return scope


def _snapshot(request: web.Request) -> Snapshot:
    """The snapshot the request names as the caller sees it, or the hub's RepoNotFound /
    RevisionNotFound (also for one the caller may not see: as if it did not exist)."""
    repo = _repo(request.match_info["org"], request.match_info["repo"])
    revision = _revision(request.match_info.get("revision", "main"))
    source, scope = request.app[SOURCE], scope_of(request)
    snap = scope.view(source.snapshot(repo, revision))
    if snap is not None:
        return snap
    # The source says only "none": a repository it knows at main has the revision missing.
    if revision != "main" and scope.view(source.snapshot(repo, "main")) is not None:
        raise HubError(
            404, f"revision {revision!r} of {repo} is not in the mirror", "RevisionNotFound"
        )
    raise HubError(404, f"repository {repo} is not in the mirror", "RepoNotFound")


# Git ids.


def is_lfs(f: ModelFile) -> bool:
    """The module's rule: a file without a git blob id is an LFS file (its sha256 names it)."""
    return not f.git_oid


def _git_id(kind: str, data: bytes) -> str:
    return hashlib.sha1(f"{kind} {len(data)}\0".encode() + data, usedforsecurity=False).hexdigest()


def lfs_pointer(f: ModelFile) -> bytes:
    """The pointer file the hub keeps in git for an LFS file."""
    return f"version {_LFS_SPEC}\noid sha256:{f.sha256}\nsize {f.size}\n".encode()


def blob_id(f: ModelFile) -> str:
    """The file's git blob id: the hub's for a plain file, the pointer's for an LFS file."""
    return f.git_oid if f.git_oid else _git_id("blob", lfs_pointer(f))


def tree_ids(files: Iterable[ModelFile]) -> dict[str, str]:
    """Each directory's git tree id ("" is the root), computed from its entries as git does."""
    entries: dict[str, dict[str, tuple[str, str]]] = {"": {}}  # dir -> name -> (mode, id)
    for f in files:
        parent, _, name = f.path.rpartition("/")
        entries.setdefault(parent, {})[name] = ("100644", blob_id(f))
        while parent:
            parent = parent.rpartition("/")[0]
            entries.setdefault(parent, {})
    ids: dict[str, str] = {}
    for d in sorted(entries, key=lambda d: -(d.count("/") + 1) if d else 0):  # deepest first
        ids[d] = _tree_id(entries[d])
        if d:
            parent, _, name = d.rpartition("/")
            entries[parent][name] = ("40000", ids[d])
    return ids


def _tree_id(entries: dict[str, tuple[str, str]]) -> str:
    # git orders a tree's entries by name, a directory's name as if it ended with "/".
    def key(name: str) -> bytes:
        return (name + "/" if entries[name][0] == "40000" else name).encode()

    body = b"".join(
        f"{entries[n][0]} {n}\0".encode() + bytes.fromhex(entries[n][1])
        for n in sorted(entries, key=key)
    )
    return _git_id("tree", body)


# Model info and tree.


def _hub_time(value: str) -> str:
    """An ISO 8601 time as the hub writes it (2024-05-01T10:00:00.000Z); "" if not one."""
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return ""
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z"


def _sibling(f: ModelFile, blobs: bool) -> dict[str, object]:
    if not blobs:
        return {"rfilename": f.path}
    sibling: dict[str, object] = {"rfilename": f.path, "size": f.size, "blobId": blob_id(f)}
    if is_lfs(f):
        pointer = len(lfs_pointer(f))
        sibling["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": pointer}
    if f.sha256:
        sibling["llmgw_sha256"] = f.sha256
    return sibling


def info_body(snap: Snapshot, blobs: bool) -> dict[str, object]:
    """The hub's model info for a snapshot (what ModelInfo is built from)."""
    body: dict[str, object] = {
        "_id": hashlib.sha1(snap.repo.encode(), usedforsecurity=False).hexdigest()[:24],
        "id": snap.repo,
        "modelId": snap.repo,
        "author": snap.repo.partition("/")[0],
        "sha": snap.commit,
        "private": False,
        "disabled": False,
        "gated": False,  # a caller sees only what it may download (see the module's doc)
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "siblings": [_sibling(f, blobs) for f in snap.files],
        "spaces": [],
        "usedStorage": sum(f.size for f in snap.files),
    }
    if modified := _hub_time(snap.last_modified):
        body["lastModified"] = modified
    return body


def _file_entry(f: ModelFile) -> dict[str, object]:
    entry: dict[str, object] = {"type": "file", "oid": blob_id(f), "size": f.size, "path": f.path}
    if is_lfs(f):
        entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": len(lfs_pointer(f))}
    if f.sha256:
        entry["llmgw_sha256"] = f.sha256
    return entry


def _under(path: str, prefix: str, recursive: bool) -> bool:
    return path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :])


def tree_entries(snap: Snapshot, base: str, recursive: bool) -> list[dict[str, object]]:
    """The entries under a directory ("" the root), directories first, each kind by path."""
    ids = tree_ids(snap.files)
    if base not in ids:
        what = "a file, not a directory" if snap.file(base) else "not in the repository"
        raise HubError(404, f"{base!r} is {what} at {snap.commit}", "EntryNotFound")
    prefix = f"{base}/" if base else ""
    dirs: list[dict[str, object]] = [
        {"type": "directory", "oid": ids[d], "size": 0, "path": d}
        for d in sorted(ids)
        if d and _under(d, prefix, recursive)
    ]
    files = sorted(
        (f for f in snap.files if _under(f.path, prefix, recursive)), key=lambda f: f.path
    )
    return dirs + [_file_entry(f) for f in files]


def _json(body: object, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(body), content_type="application/json", headers=headers
    )


async def model_info(request: web.Request) -> web.Response:
    """GET /api/models/{org}/{repo}[/revision/{revision}]"""
    return _json(info_body(_snapshot(request), _flag(request, "blobs")))


async def tree(request: web.Request) -> web.Response:
    """GET /api/models/{org}/{repo}/tree/{revision}[/{path}], a page at a time (Link rel="next")."""
    snap = _snapshot(request)
    path = request.match_info.get("path", "").strip("/")
    entries = tree_entries(snap, _path(path) if path else "", _flag(request, "recursive"))
    cursor = request.query.get("cursor", "0")
    if not _CURSOR_RE.fullmatch(cursor) or int(cursor) > len(entries):
        raise HubError(400, f"{cursor[:40]!r} is not a cursor of this listing")
    start, size = int(cursor), request.app[PAGE_SIZE]
    headers = {}
    if start + size < len(entries):
        following = request.url.update_query(cursor=str(start + size))
        headers["Link"] = f'<{following}>; rel="next"'
    return _json(entries[start : start + size], headers)


# Files.


def _position(digits: str) -> int:
    """A range's number as written (leading zeros stripped): past the end of any file when it
    has more digits than a file's size can (int() would refuse over 4,300, and need not read
    them)."""
    return int(digits or "0") if len(digits) <= 18 else _FAR


def _range(fields: list[str], size: int) -> tuple[int, int] | None:
    """(start, count) of the one byte range asked for; None to send the whole file: no Range,
    or one a server may ignore (RFC 9110 14.2: malformed, several ranges or Range fields, a
    last position before the first); HubError 416 when it cannot be satisfied (it starts at or
    past the end, or asks for the last 0 bytes)."""
    if len(fields) != 1:
        return None
    match = _RANGE_RE.fullmatch(fields[0].strip())
    if match is None or match.group(1) == match.group(2) == "":
        return None
    first, last = (g.lstrip("0") or ("0" if g else "") for g in match.groups())
    if not first:  # the last N bytes: the whole file when it is shorter
        suffix = _position(last)
        if suffix == 0 or size == 0:
            raise _unsatisfiable(size)
        start = max(size - suffix, 0)
        return start, size - start
    if last and (len(last), last) < (len(first), first):  # compared as written: any length
        return None
    start = _position(first)
    if start >= size:
        raise _unsatisfiable(size)
    end = min(_position(last), size - 1) if last else size - 1
    return start, end - start + 1


def _ranges(request: web.Request, etag: str) -> list[str]:
    """The Range fields to answer: none when If-Range names another version (RFC 9110 13.1.5:
    another ETag, a weak one, or a date, as no Last-Modified is sent: the whole file then)."""
    if_range = request.headers.get("If-Range")
    if if_range is not None and if_range.strip() != etag:
        return []
    return request.headers.getall("Range", [])


def _unsatisfiable(size: int) -> HubError:
    message = f"the range asked for is outside the file ({size} bytes)"
    return HubError(416, message, headers={"Content-Range": f"bytes */{size}"})


def file_headers(snap: Snapshot, f: ModelFile) -> dict[str, str]:
    """The headers the hub sends with a file (its 302 for an LFS file), without its length."""
    headers = {
        "X-Repo-Commit": snap.commit,
        "Accept-Ranges": "bytes",
        "Content-Type": "application/octet-stream",
    }
    if is_lfs(f):
        headers |= {"ETag": f'"{f.sha256}"', "X-Linked-Etag": f'"{f.sha256}"'}
        headers["X-Linked-Size"] = str(f.size)
    else:
        headers["ETag"] = f'"{f.git_oid}"'
    return headers


def _open(path: Path, size: int, name: str) -> BinaryIO:
    """The blob, open, checked to have the size the snapshot records."""
    fobj = path.open("rb")
    actual = os.fstat(fobj.fileno()).st_size
    if actual != size:
        fobj.close()
        message = f"the mirror's copy of {name!r} holds {actual} bytes, its record {size}"
        raise HubError(500, f"{message}: it does not match its record")
    return fobj


SEND_CHUNK = 1 << 20


async def _send(
    loop: asyncio.AbstractEventLoop,
    transport: asyncio.Transport,
    response: web.StreamResponse,
    fobj: BinaryIO,
    start: int,
    count: int,
) -> None:
    """The file's bytes: by sendfile where the loop has it, else read and written in chunks
    (uvloop, which llmgwd runs on, has no loop.sendfile: it raises NotImplementedError)."""
    try:
        await loop.sendfile(transport, fobj, start, count)
        return
    except NotImplementedError:
        pass
    fobj.seek(start)
    while count > 0:
        chunk = await loop.run_in_executor(None, fobj.read, min(SEND_CHUNK, count))
        if not chunk:
            raise ConnectionResetError("the file ended early")
        await response.write(chunk)
        count -= len(chunk)


async def resolve(request: web.Request) -> web.StreamResponse:
    """GET and HEAD /{org}/{repo}/resolve/{revision}/{path}: the file, ranges answered."""
    snap = _snapshot(request)
    path = _path(request.match_info["path"])
    f = snap.file(path)
    commit = {"X-Repo-Commit": snap.commit}
    if f is None:
        message = f"{path!r} is not in {snap.repo} at {snap.commit}"
        raise HubError(404, message, "EntryNotFound", commit)
    blob = request.app[SOURCE].blob(f.sha256) if f.sha256 else None
    if blob is None:
        message = f"{path!r} of {snap.repo} is not yet mirrored; try again later"
        raise HubError(503, message, headers=commit | {"Retry-After": str(RETRY_AFTER_S)})
    headers = file_headers(snap, f)
    span = _range(_ranges(request, headers["ETag"]), f.size)
    start, count = span if span is not None else (0, f.size)
    response = web.StreamResponse(status=206 if span else 200, headers=headers)
    response.content_length = count
    if span is not None:
        response.headers["Content-Range"] = f"bytes {start}-{start + count - 1}/{f.size}"
    loop = asyncio.get_running_loop()
    fobj = await loop.run_in_executor(None, _open, blob, f.size, path)
    try:
        await response.prepare(request)
        if count and request.method != "HEAD":
            if request.transport is None:
                raise ConnectionResetError("the client left")
            await _send(loop, request.transport, response, fobj, start, count)
        await response.write_eof()
    except ConnectionError:
        log.debug("hf: the client left during %s", request.path)
    finally:
        fobj.close()
    return response


# The application.


def _error(request: web.Request, e: HubError) -> web.Response:
    """The answer, logged once (the path and the message, never a header)."""
    level = logging.ERROR if e.status >= 500 else logging.INFO
    log.log(level, "hf: %s %r: %d %s", request.method, request.path, e.status, e.detail.message)
    return error_answer(e)


def error_answer(e: HubError) -> web.Response:
    """The hub's error body, {"error": MESSAGE}, with X-Error-Message (and X-Error-Code)."""
    return e.response()


@web.middleware
async def hub_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure, the auth middleware's too, leaves in the hub's shape, never as a traceback."""
    try:
        return await handler(request)
    except HubError as e:
        return _error(request, e)
    except ApiError as e:  # from the auth middleware
        return _error(request, HubError(e.status, e.detail.message, headers=e.headers))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        kept = {k: v for k, v in e.headers.items() if k in _KEPT_HEADERS}
        return _error(request, HubError(e.status, e.reason, headers=kept))
    except Exception:
        log.exception("hf: %s %r failed", request.method, request.path)
        return error_answer(HubError(500, "internal error"))


def hub_routes() -> list[web.RouteDef]:
    """The routes, relative to where the app is mounted (/hf); each GET answers HEAD too."""
    models = "/api/models/{org}/{repo}"
    return [
        web.get(models, model_info),
        web.get(models + "/revision/{revision}", model_info),
        web.get(models + "/tree/{revision}", tree),
        web.get(models + "/tree/{revision}/{path:.+}", tree),
        web.get("/{org}/{repo}/resolve/{revision}/{path:.+}", resolve),
    ]


def hub_app(
    source: SnapshotSource, auth: Middleware, page_size: int = TREE_PAGE_SIZE
) -> web.Application:
    """The hub's protocol over a source, to mount with parent.add_subapp("/hf", ...)."""
    app = web.Application(middlewares=[hub_errors, auth])
    app[SOURCE] = source
    app[PAGE_SIZE] = page_size
    app.add_routes(hub_routes())
    return app
