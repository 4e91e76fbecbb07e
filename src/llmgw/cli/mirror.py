"""llmgw mirror status|import|sweep|add-peer: the cluster's copy of models' files."""

from __future__ import annotations

import hashlib
import http.client
import os
from pathlib import Path
from typing import Any

import click
import msgspec

from llmgw import ipc
from llmgw.api_types import (
    ImportFile,
    ImportIn,
    ImportOut,
    MirrorStatus,
    PeerIn,
    PeerView,
    SweepIn,
    SweepOut,
)
from llmgw.cli import https
from llmgw.cli.common import (
    API,
    Refused,
    Settings,
    Unreachable,
    call,
    decoded,
    error_message,
    pass_settings,
)
from llmgw.cli.output import ago, echo_json, echo_table, json_option, size
from llmgw.cli.progress import describe

# Files the hub would keep in git rather than LFS: small ones that are not weights. They
# get a git blob id beside their sha256, as the hub lists them.
GIT_MAX_BYTES = 10 << 20
LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".onnx", ".h5", ".msgpack")
CHUNK = 1 << 20


@click.group()
def mirror() -> None:
    """The mirror of models' files that llmgwd keeps and serves to nodes and to /hf."""


@mirror.command()
@json_option
@pass_settings
def status(settings: Settings, as_json: bool) -> None:
    """What the mirror holds, the sets it is fetching (the whole set's progress), its peers
    and, among several control planes, which of them holds each model's set."""
    answer = call(settings, "GET", f"{API}/mirror")
    if as_json:
        echo_json(answer)
        return
    s = decoded(answer, MirrorStatus)
    click.echo(
        f"Mirror {s.dir}: {s.files_held} files, {size(s.bytes_held)}, "
        f"{size(s.free_bytes)} free; upstream {s.upstream}"
    )
    for st in s.sets:
        end = f" ({st.state}{': ' + st.error if st.error else ''})"
        click.echo("  " + describe(st) + (end if st.state != "fetching" else ""))
    for p in s.peers:
        err = f", {p.last_error}" if p.last_error else ""
        click.echo(f"  peer {p.url}: synced {ago(p.last_sync)}{err}")
    for h in s.held:
        where = ", ".join(h.planes) or "no control plane yet"
        fetching = f" ({h.fetching} fetching it from upstream)" if h.fetching else ""
        click.echo(f"  {h.source} on {where}{fetching}")


def _is_git(path: Path, n: int) -> bool:
    return n <= GIT_MAX_BYTES and not path.name.endswith(LFS_SUFFIXES)


def _hash(path: Path) -> tuple[int, str, str]:
    """Size, sha256 and (for a file the hub keeps in git) its git blob id."""
    n = path.stat().st_size
    sha = hashlib.sha256()
    git = hashlib.sha1(b"blob %d\0" % n, usedforsecurity=False) if _is_git(path, n) else None
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
            if git is not None:
                git.update(chunk)
    return n, sha.hexdigest(), git.hexdigest() if git is not None else ""


def _upload(settings: Settings, path: Path, sha: str, n: int) -> None:
    put_file(settings, f"{API}/mirror/uploads/{sha}", path, n)


def put_file(settings: Settings, url: str, path: Path, n: int) -> Any:
    """PUT a file's n bytes to url, streamed from the file; the JSON answer (Refused on an
    error answer, Unreachable on a connection broken off)."""
    remote, timeout = settings.remote(), max(settings.timeout, 600.0)
    conn: http.client.HTTPConnection = (
        https.connection(remote, timeout)
        if remote
        else ipc.UnixHTTPConnection(settings.socket, timeout)
    )
    headers = {"Content-Length": str(n), "Accept": "application/json"}
    headers |= https.auth_headers(remote) if remote else {}
    try:
        with open(path, "rb") as f:
            conn.request("PUT", url, body=f, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
    except OSError as e:
        raise Unreachable(f"the upload of {path} broke off: {e.strerror or e}") from None
    except http.client.HTTPException:
        raise Unreachable(f"llmgwd broke off its answer to the upload of {path}") from None
    finally:
        conn.close()
    try:
        answer: Any = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        answer = None
    if resp.status >= 400:
        raise Refused(f"{path}: {error_message(answer, resp.status)}")
    return answer


def _files(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        out += [Path(dirpath) / f for f in sorted(filenames) if not f.startswith(".")]
    return out


@mirror.command("import")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--as",
    "repo",
    required=True,
    metavar="ORG/REPO",
    help="The repository it becomes, as if it came from the hub.",
)
@click.option("--revision", default="main", show_default=True, help="The branch that names it.")
@json_option
@pass_settings
def import_(settings: Settings, directory: Path, repo: str, revision: str, as_json: bool) -> None:
    """Put DIRECTORY's files into the mirror as ORG/REPO (an air-gapped site's way in): then
    `llmgw model add NAME --from hf:ORG/REPO` serves them."""
    files = []
    paths = _files(directory)
    if not paths:
        raise click.UsageError(f"{directory} holds no files")
    for i, path in enumerate(paths, 1):
        n, sha, git = _hash(path)
        rel = path.relative_to(directory).as_posix()
        click.echo(f"[{i}/{len(paths)}] {rel}: {size(n)}, uploading", err=True)
        _upload(settings, path, sha, n)
        files.append(ImportFile(path=rel, size=n, sha256=sha, git_oid=git))
    body = ImportIn(repo=repo, revision=revision, files=files)
    answer = call(settings, "POST", f"{API}/mirror/import", body)
    if as_json:
        echo_json(answer)
        return
    done = decoded(answer, ImportOut)
    click.echo(
        f"Imported {done.files} files ({size(done.bytes)}) as "
        f"{done.repo}@{done.revision} (commit {done.commit[:12]})."
    )
    click.echo(f"Add it with: llmgw model add NAME --from hf:{repo}")


@mirror.command()
@click.option("--dry-run", is_flag=True, help="Only say what would be deleted.")
@json_option
@pass_settings
def sweep(settings: Settings, dry_run: bool, as_json: bool) -> None:
    """Delete the files no model uses, on the mirror and on every node. A node's figures are
    what it no longer lists once it has listed its files again, not what it was asked."""
    answer = call(settings, "POST", f"{API}/mirror/sweep", SweepIn(dry_run=dry_run))
    if as_json:
        echo_json(answer)
        return
    out = decoded(answer, SweepOut)
    verb = "would free" if dry_run else "freed"
    click.echo(f"mirror: {out.files} files, {verb} {size(out.bytes)}")
    rows = [
        (n.node, n.files, size(n.bytes), n.kept, "yes" if n.answered else "no answer")
        for n in out.nodes
    ]
    echo_table(["NODE", "FILES", "BYTES", "KEPT", "LISTED AGAIN"], rows, "no node connected")


@mirror.command("add-peer")
@click.argument("url")
@click.option(
    "--token-file",
    default="",
    metavar="PATH",
    help="A file, readable by llmgwd, holding a key of the peer.",
)
@json_option
@pass_settings
def add_peer(settings: Settings, url: str, token_file: str, as_json: bool) -> None:
    """Copy every set another mirror holds (URL: its /hf, https://HOST:7700/hf), and drop
    the ones it drops. On a mirror alone (mode: mirror) it also says what a control plane's
    operator runs to copy from this machine."""
    answer = call(settings, "POST", f"{API}/mirror/peers", PeerIn(url=url, token_file=token_file))
    if as_json:
        echo_json(answer)
    else:
        peer = decoded(answer, PeerView)
        click.echo(f"Added peer {peer.url}: its sets are being copied (llmgw mirror status).")
        if peer.as_peer:  # this llmgwd is a mirror alone
            click.echo(peer.as_peer)
