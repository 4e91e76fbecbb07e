"""The mirror's hub protocol (/hf) as the official huggingface_hub client meets it on a socket."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.typedefs import Handler, Middleware
from yarl import URL

from llmgw.errors import ApiError
from llmgw.wire import ModelFile
from llmgwd.mirror.hub_server import hub_app
from llmgwd.mirror.snapshot import Snapshot

KEY = "sk-llmgw-HubTestKey0123456789"
WRONG = "sk-llmgw-WRONGwrongWRONG0000"
REPO = "acme/tiny-model"
PENDING = "acme/pending"  # a repository whose file the mirror has not fetched yet
COMMIT = hashlib.sha1(b"the commit").hexdigest()
BIG = 12 * 1024 * 1024 + 7  # the LFS file's size: the client reads 10 MiB chunks
CUT = 11 * 1024 * 1024  # where its first download is cut (after a chunk, or no resume)
HF = Path(sys.executable).parent / "hf"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


CONTENTS: dict[str, bytes] = {
    "config.json": b'{"model_type": "tiny"}\n',
    "README.md": b"# tiny\n",
    "sub/dir/tokenizer.json": b'{"vocab": {"a": 0}}\n' * 50,
    "sub/weights.bin": bytes(range(256)) * 400,
    "model.safetensors": os.urandom(BIG),
}
LFS = {"model.safetensors", "sub/weights.bin"}


def model_file(path: str, data: bytes) -> ModelFile:
    sha = hashlib.sha256(data).hexdigest()
    return ModelFile(path, len(data), sha, "" if path in LFS else git_blob_id(data))


class Source:
    """What the mirror holds: snapshots by (repo, revision), blobs in a directory."""

    def __init__(self, root: Path) -> None:
        self.blobs: dict[str, Path] = {}
        files = []
        for path, data in CONTENTS.items():
            f = model_file(path, data)
            blob = root / f.sha256
            blob.write_bytes(data)
            self.blobs[f.sha256] = blob
            files.append(f)
        snap = Snapshot(repo=REPO, commit=COMMIT, files=files, last_modified="2024-05-01T10:00:00Z")
        pending = Snapshot(repo=PENDING, commit=COMMIT, files=[ModelFile("x.bin", 4, "ab" * 32)])
        self.snaps = {(REPO, r): snap for r in ("main", COMMIT, "refs/pr/1")}
        self.snaps[(PENDING, "main")] = pending

    def snapshot(self, repo: str, revision: str) -> Snapshot | None:
        return self.snaps.get((repo, revision))

    def blob(self, sha256: str) -> Path | None:
        return self.blobs.get(sha256)


def one_key(key: str) -> Middleware:
    """A stand-in for llmgwd's key auth: one key, the same refusal llmgwd raises."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {key}":
            raise ApiError(401, "the API key is not valid", "authentication_error", "invalid_key")
        return await handler(request)

    return auth


@dataclass
class Hub:
    url: str  # the HF_ENDPOINT
    home: Path
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, Range
    cut: set[str] = field(default_factory=set)  # paths whose first full GET is cut


def recorder(hub: Hub) -> Middleware:
    """Records every request; cuts the connection in the middle of a file named in hub.cut."""

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        hub.requests.append((request.method, request.path, request.headers.get("Range", "")))
        name = request.path.rpartition("/")[2]
        if request.method == "GET" and name in hub.cut and "Range" not in request.headers:
            hub.cut.discard(name)
            response = web.StreamResponse(headers={"X-Repo-Commit": COMMIT})
            response.content_length = BIG
            await response.prepare(request)
            await response.write(CONTENTS["model.safetensors"][:CUT])
            assert request.transport is not None
            request.transport.close()
            return response
        return await handler(request)

    return record


async def start(tmp_path: Path, page_size: int = 1000) -> AsyncIterator[Hub]:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    hub = Hub(url="", home=tmp_path / "hf-home")
    parent = web.Application(middlewares=[recorder(hub)])
    parent.add_subapp("/hf", hub_app(Source(blobs), one_key(KEY), page_size=page_size))
    server = TestServer(parent, host="127.0.0.1")
    await server.start_server()
    hub.url = f"http://127.0.0.1:{server.port}/hf"
    try:
        yield hub
    finally:
        await server.close()


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Hub]:
    async for h in start(tmp_path):
        yield h


@pytest.fixture
async def paged(tmp_path: Path) -> AsyncIterator[Hub]:
    async for h in start(tmp_path, page_size=2):
        yield h


def client_env(hub: Hub) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env = {k: v for k, v in env.items() if "proxy" not in k.lower()}
    return env | {
        "HF_ENDPOINT": hub.url,
        "HF_TOKEN": KEY,
        "HF_HOME": str(hub.home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }


async def run(hub: Hub, *argv: str) -> tuple[int, str]:
    """A command in the client's environment (it reads HF_ENDPOINT at import), not blocking
    the server on this loop."""
    proc = await asyncio.create_subprocess_exec(
        *argv, env=client_env(hub), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode()


async def python(hub: Hub, code: str) -> Any:
    """Runs client code that prints one JSON value last; returns that value."""
    rc, out = await run(hub, sys.executable, "-c", code)
    assert rc == 0, out
    return json.loads(out.strip().splitlines()[-1])


def read(path: str) -> bytes:
    return Path(path).read_bytes()


def assert_same_files(root: Path) -> None:
    for path, data in CONTENTS.items():
        assert (root / path).read_bytes() == data, path


async def test_snapshot_download_fetches_every_file_byte_identical(hub: Hub) -> None:
    code = (
        "import json\nfrom huggingface_hub import snapshot_download\n"
        f"print(json.dumps(snapshot_download({REPO!r}, revision='main')))"
    )
    folder = Path(await python(hub, code))
    assert folder.name == COMMIT  # main resolved to the pinned commit
    assert_same_files(folder)
    assert not any("/resolve/" in p and r for _, p, r in hub.requests)  # whole files, no ranges


async def test_hf_download_command_fills_a_local_dir(hub: Hub, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    rc, out = await run(
        hub, str(HF), "download", REPO, "--revision", "main", "--local-dir", str(out_dir)
    )
    assert rc == 0, out
    assert_same_files(out_dir)


async def test_hf_hub_download_resumes_a_cut_download_with_a_range(hub: Hub) -> None:
    hub.cut.add("model.safetensors")
    code = (
        "import json\nfrom huggingface_hub import hf_hub_download\n"
        f"a = hf_hub_download({REPO!r}, 'sub/dir/tokenizer.json', revision='main')\n"
        f"b = hf_hub_download({REPO!r}, 'model.safetensors', revision={COMMIT!r})\n"
        "print(json.dumps([a, b]))"
    )
    small, big = await python(hub, code)
    assert read(small) == CONTENTS["sub/dir/tokenizer.json"]
    assert read(big) == CONTENTS["model.safetensors"]
    gets = [r for m, p, r in hub.requests if m == "GET" and p.endswith("/model.safetensors")]
    assert len(gets) == 2 and gets[0] == ""  # the cut one, then the rest only
    assert gets[1].startswith("bytes=") and int(gets[1][6:].rstrip("-")) > 0


async def test_tree_and_model_info_give_sizes_and_checksums(paged: Hub) -> None:
    code = f"""
import json
from huggingface_hub import HfApi
api = HfApi()
tree = [
    [type(e).__name__, e.path, getattr(e, "size", 0), getattr(e, "blob_id", None),
     e.lfs.sha256 if getattr(e, "lfs", None) else None]
    for e in api.list_repo_tree({REPO!r}, recursive=True)
]
info = api.model_info({REPO!r}, files_metadata=True)
sib = [[s.rfilename, s.size, s.blob_id, s.lfs.sha256 if s.lfs else None] for s in info.siblings]
at = api.model_info({REPO!r}, revision="refs/pr/1")
print(json.dumps([tree, sib, info.sha, str(info.last_modified), at.sha]))
"""
    tree, siblings, sha, modified, sha_pr = await python(paged, code)
    assert sha == sha_pr == COMMIT and modified.startswith("2024-05-01 10:00:00")
    files = {path: [size, blob, lfs] for kind, path, size, blob, lfs in tree if kind == "RepoFile"}
    dirs = {path for kind, path, *_ in tree if kind == "RepoFolder"}
    assert dirs == {"sub", "sub/dir"}
    assert {s[0]: s[1:] for s in siblings} == files
    for path, data in CONTENTS.items():
        size, blob, lfs = files[path]
        assert size == len(data)
        if path in LFS:
            assert lfs == hashlib.sha256(data).hexdigest()
        else:
            assert (blob, lfs) == (git_blob_id(data), None)
    assert sum(1 for _, p, _ in paged.requests if "/tree/" in p) == 4  # 7 entries, pages of 2


async def test_the_client_raises_the_hubs_errors(hub: Hub) -> None:
    code = f"""
import json
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError
def name(call):
    try:
        call()
    except HfHubHTTPError as e:
        return [type(e).__name__, e.response.status_code, str(e)]
    return None
print(json.dumps({{
    "key": name(lambda: hf_hub_download({REPO!r}, "config.json", token={WRONG!r})),
    "repo": name(lambda: hf_hub_download("acme/nothing", "config.json")),
    "info": name(lambda: HfApi().model_info("acme/nothing")),
    "file": name(lambda: hf_hub_download({REPO!r}, "nothing.json")),
    "revision": name(lambda: hf_hub_download({REPO!r}, "config.json", revision="v9")),
}}))
"""
    got = await python(hub, code)
    assert got["key"][:2] == ["HfHubHTTPError", 401]
    assert "Invalid credentials" in got["key"][2] and WRONG not in got["key"][2]
    assert got["repo"][:2] == got["info"][:2] == ["RepositoryNotFoundError", 404]
    assert got["file"][:2] == ["RemoteEntryNotFoundError", 404]  # an EntryNotFoundError
    assert got["revision"][:2] == ["RevisionNotFoundError", 404]


# The same routes, read directly.


async def fetch(
    hub: Hub, method: str, path: str, key: str = KEY, **headers: str
) -> tuple[aiohttp.ClientResponse, bytes]:
    url = URL(hub.url + path, encoded=True)
    headers["Authorization"] = f"Bearer {key}"
    async with aiohttp.ClientSession() as s, s.request(method, url, headers=headers) as r:
        return r, await r.read()


async def test_resolve_sends_the_hubs_headers_and_no_xet(hub: Hub) -> None:
    data = CONTENTS["model.safetensors"]
    r, body = await fetch(hub, "HEAD", f"/{REPO}/resolve/main/model.safetensors")
    sha = hashlib.sha256(data).hexdigest()
    assert (r.status, body) == (200, b"")
    assert r.headers["X-Repo-Commit"] == COMMIT  # main is answered with the pinned commit
    assert r.headers["ETag"] == r.headers["X-Linked-Etag"] == f'"{sha}"'
    assert r.headers["X-Linked-Size"] == r.headers["Content-Length"] == str(len(data))
    assert r.headers["Accept-Ranges"] == "bytes"
    assert r.headers["Content-Type"] == "application/octet-stream"
    assert not [h for h in r.headers if h.lower().startswith("x-xet")]
    assert "xet" not in r.headers.get("Link", "")
    small = CONTENTS["sub/dir/tokenizer.json"]
    r, body = await fetch(hub, "GET", f"/{REPO}/resolve/{COMMIT}/sub/dir/tokenizer.json")
    assert (r.status, body, r.headers["ETag"]) == (200, small, f'"{git_blob_id(small)}"')
    assert "X-Linked-Etag" not in r.headers and "X-Linked-Size" not in r.headers


async def test_resolve_answers_ranges(hub: Hub) -> None:
    data, path = CONTENTS["model.safetensors"], f"/{REPO}/resolve/main/model.safetensors"
    r, body = await fetch(hub, "GET", path, Range="bytes=10-19")
    assert (r.status, body, r.headers["Content-Range"]) == (206, data[10:20], f"bytes 10-19/{BIG}")
    r, body = await fetch(hub, "GET", path, Range=f"bytes={BIG - 5}-")
    assert (r.status, body) == (206, data[-5:])
    r, body = await fetch(hub, "GET", path, Range="bytes=-3")
    assert (r.status, body, r.headers["Content-Range"]) == (
        206,
        data[-3:],
        f"bytes {BIG - 3}-{BIG - 1}/{BIG}",
    )
    r, body = await fetch(hub, "GET", path, Range=f"bytes={BIG}-")
    assert (r.status, r.headers["Content-Range"]) == (416, f"bytes */{BIG}")
    assert "error" in json.loads(body)
    r, body = await fetch(hub, "GET", path, Range="bytes=0-1,5-6")  # several: the whole file
    assert (r.status, len(body)) == (200, BIG)


HUGE = "9" * 4400  # more digits than int() reads (4,300)
WHOLE = (200, 0, BIG)  # the Range ignored: the whole file
# Range as written -> (status, first byte, bytes sent); 416: none sent, Content-Range */size.
RANGES: dict[str, tuple[int, int, int]] = {
    f"bytes={HUGE}-": (416, 0, 0),
    f"bytes={HUGE[:4000]}-{HUGE[:4001]}": (416, 0, 0),  # (aiohttp reads 8,190 bytes of a header)
    f"bytes=0-{HUGE}": (206, 0, BIG),  # the last position past the end: up to the end
    f"bytes=-{HUGE}": (206, 0, BIG),  # a suffix longer than the file: all of it
    f"bytes={'0' * 4000}5-{'0' * 4000}9": (206, 5, 5),  # leading zeros are the same number
    "BYTES=3-3": (206, 3, 1),  # the unit is case-insensitive
    "bytes=-0": (416, 0, 0),  # the last 0 bytes
    f"bytes={BIG}-{BIG + 9}": (416, 0, 0),
    "bytes=5-3": WHOLE,  # last before first: invalid, ignored
    f"bytes={HUGE}-{HUGE[:3000]}": WHOLE,
    "bytes=0005-03": WHOLE,
    "bytes=-5-10": WHOLE,
    "bytes=--5": WHOLE,
    "bytes=0-1,5-6": WHOLE,  # several ranges
    "bytes=\u00b2-": WHOLE,  # not an ASCII digit
    "bytes=": WHOLE,
    "bytes=-": WHOLE,
    "items=0-5": WHOLE,
    "garbage": WHOLE,
}


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("header", list(RANGES), ids=lambda h: h[:24])
async def test_any_range_is_answered_or_ignored_never_a_500(
    hub: Hub, method: str, header: str
) -> None:
    status, first, count = RANGES[header]
    data, path = CONTENTS["model.safetensors"], f"/{REPO}/resolve/main/model.safetensors"
    r, body = await fetch(hub, method, path, Range=header)
    assert r.status == status, body[:200]
    if status == 416:
        assert r.headers["Content-Range"] == f"bytes */{BIG}"
        assert len(r.headers["X-Error-Message"]) < 200  # the header is not echoed
    else:
        assert r.headers["Content-Length"] == str(count)
        assert body == (b"" if method == "HEAD" else data[first : first + count])
    if status == 206:
        assert r.headers["Content-Range"] == f"bytes {first}-{first + count - 1}/{BIG}"


async def test_two_range_fields_are_several_ranges_ignored(hub: Hub) -> None:
    url = URL(f"{hub.url}/{REPO}/resolve/main/config.json", encoded=True)
    headers = [("Authorization", f"Bearer {KEY}"), ("Range", "bytes=0-1"), ("Range", "bytes=3-4")]
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        assert (r.status, await r.read()) == (200, CONTENTS["config.json"])


async def test_if_range_of_another_version_gets_the_whole_file(hub: Hub) -> None:
    """RFC 9110 13.1.5: a client resuming a file that changed since must not get a piece of
    the new one spliced onto the old (main may name another commit by then)."""
    data, path = CONTENTS["model.safetensors"], f"/{REPO}/resolve/main/model.safetensors"
    etag = f'"{hashlib.sha256(data).hexdigest()}"'
    r, body = await fetch(hub, "GET", path, Range="bytes=10-19", **{"If-Range": etag})
    assert (r.status, body) == (206, data[10:20])
    for other in ('"0123"', f"W/{etag}", "Wed, 01 May 2024 10:00:00 GMT", "garbage"):
        r, body = await fetch(hub, "GET", path, Range="bytes=10-19", **{"If-Range": other})
        assert (r.status, len(body)) == (200, BIG), other


async def test_a_quoted_revision_is_decoded_once(hub: Hub) -> None:
    r, body = await fetch(hub, "GET", f"/{REPO}/resolve/refs%2Fpr%2F1/config.json")
    assert (r.status, body) == (200, CONTENTS["config.json"])
    r, body = await fetch(hub, "GET", f"/api/models/{REPO}/revision/refs%2Fpr%2F1")
    assert json.loads(body)["sha"] == COMMIT
    r, body = await fetch(hub, "GET", f"/{REPO}/resolve/refs%252Fpr%252F1/config.json")
    assert r.status == 400 and "is not a branch, tag or commit" in json.loads(body)["error"]


@pytest.mark.parametrize(
    "path",
    [
        f"/{REPO}/resolve/main/sub/%2E%2E/%2E%2E/etc/passwd",
        f"/{REPO}/resolve/main/..%2Fconfig.json",
        f"/{REPO}/resolve/main/config.json%00",
        f"/{REPO}/resolve/main/sub//dir/tokenizer.json",
        "/ac..me/x/resolve/main/config.json",
        "/api/models/-acme/x",
        f"/api/models/{REPO}/revision/ma%20in",
        f"/api/models/{REPO}/tree/main/%2E%2E",
        f"/api/models/{REPO}/tree/main?cursor=x",
        f"/api/models/{REPO}/tree/main?cursor={'9' * 4400}",
        f"/api/models/{REPO}/tree/main?cursor=%C2%B2",  # a digit to str.isdigit, not to int()
        f"/api/models/{REPO}/tree/main?cursor=-1",
    ],
)
async def test_bad_input_is_a_400_in_the_hubs_shape(hub: Hub, path: str) -> None:
    r, body = await fetch(hub, "GET", path)
    assert r.status == 400, body
    assert json.loads(body)["error"] and r.headers["X-Error-Message"]


async def test_a_file_not_yet_mirrored_is_a_503_that_says_so(hub: Hub) -> None:
    for method in ("HEAD", "GET"):
        r, _ = await fetch(hub, method, f"/{PENDING}/resolve/main/x.bin")
        assert (r.status, r.headers["Retry-After"], r.headers["X-Repo-Commit"]) == (
            503,
            "2",
            COMMIT,
        )
        assert "not yet mirrored" in r.headers["X-Error-Message"]


async def test_tree_pages_and_directories(paged: Hub) -> None:
    entries: list[dict[str, Any]] = []
    url = URL(f"{paged.url}/api/models/{REPO}/tree/main?recursive=true", encoded=True)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as s:
        while True:
            async with s.get(url) as r:
                entries += await r.json()
                if "next" not in r.links:
                    break
                url = URL(str(r.links["next"]["url"]))
    assert sorted(e["path"] for e in entries) == sorted([*CONTENTS, "sub", "sub/dir"])
    shas = {e["path"]: e.get("llmgw_sha256") for e in entries if e["type"] == "file"}
    assert shas == {p: hashlib.sha256(d).hexdigest() for p, d in CONTENTS.items()}
    r, body = await fetch(paged, "GET", f"/api/models/{REPO}/tree/main/sub")  # not recursive
    assert [e["path"] for e in json.loads(body)] == ["sub/dir", "sub/weights.bin"]
    assert "Link" not in r.headers  # one page exactly
    r, _ = await fetch(paged, "GET", f"/api/models/{REPO}/tree/main/config.json")
    assert (r.status, r.headers["X-Error-Code"]) == (404, "EntryNotFound")


def git_ids(work: Path) -> dict[str, str]:
    """What git itself says each entry's id is, the LFS files kept as their pointers."""
    for path, data in CONTENTS.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        sha = hashlib.sha256(data).hexdigest()
        pointer = (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n"
        )
        (work / path).write_bytes(pointer.encode() if path in LFS else data)
    git = ["git", "-C", str(work)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    root = subprocess.run([*git, "write-tree"], check=True, capture_output=True, text=True)
    listing = subprocess.run(
        [*git, "ls-tree", "-r", "-t", root.stdout.strip()],
        check=True,
        capture_output=True,
        text=True,
    )
    ids = {}
    for line in listing.stdout.splitlines():
        meta, path = line.split("\t")
        ids[path] = meta.split()[2]
    return ids


async def test_entry_ids_are_gits_own(hub: Hub, tmp_path: Path) -> None:
    want = git_ids(tmp_path / "git")
    _, body = await fetch(hub, "GET", f"/api/models/{REPO}/tree/main?recursive=true")
    assert {e["path"]: e["oid"] for e in json.loads(body)} == want


async def test_a_wrong_key_is_refused_and_never_logged(
    hub: Hub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for path in (f"/api/models/{REPO}", f"/{REPO}/resolve/main/config.json", "/nowhere"):
        r, body = await fetch(hub, "GET", path, key=WRONG)
        assert (
            r.status == 401
            and r.headers["X-Error-Message"] == "Invalid credentials in Authorization header"
        )
        assert WRONG.encode() not in body
    assert WRONG not in caplog.text and KEY not in caplog.text


async def test_unknown_routes_and_methods_answer_in_the_hubs_shape(hub: Hub) -> None:
    r, body = await fetch(hub, "GET", "/api/datasets/acme/x")
    assert r.status == 404 and json.loads(body)["error"]
    r, body = await fetch(hub, "POST", f"/{REPO}/resolve/main/config.json")
    assert r.status == 405 and json.loads(body)["error"] and "GET" in r.headers["Allow"]


class Broken(Source):
    """A source that fails on one repository and holds a blob of the wrong size."""

    def snapshot(self, repo: str, revision: str) -> Snapshot | None:
        if repo == "acme/broken":
            raise RuntimeError("the catalog is gone")
        return super().snapshot(repo, revision)

    def blob(self, sha256: str) -> Path | None:
        path = super().blob(sha256)
        return None if path is None else path.with_name("short")


async def test_a_failing_source_is_a_500_in_the_hubs_shape_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    source = Broken(tmp_path)
    (tmp_path / "short").write_bytes(b"12")
    parent = web.Application()
    parent.add_subapp("/hf", hub_app(source, one_key(KEY)))
    async with TestClient(TestServer(parent, host="127.0.0.1")) as c:
        auth = {"Authorization": f"Bearer {KEY}"}
        r = await c.get("/hf/api/models/acme/broken", headers=auth)
        assert (r.status, await r.json()) == (500, {"error": "internal error"})
        mine = [r for r in caplog.records if r.name == "llmgwd.mirror.hub_server"]
        assert len(mine) == 1 and mine[0].levelno == logging.ERROR
        r = await c.get(f"/hf/{REPO}/resolve/main/config.json", headers=auth)
        assert r.status == 500 and "does not match its record" in (await r.json())["error"]
        assert len([r for r in caplog.records if r.name == "llmgwd.mirror.hub_server"]) == 2


def test_resolve_sends_the_file_under_uvloop(tmp_path: Path) -> None:
    """llmgwd runs on uvloop, which has no loop.sendfile: the file still goes out whole."""
    import uvloop

    data = os.urandom(3 * 1024 * 1024 + 11)
    f = model_file("model.safetensors", data)
    (tmp_path / f.sha256).write_bytes(data)
    snap = Snapshot(repo=REPO, commit=COMMIT, files=[f])

    class One:
        def snapshot(self, repo: str, revision: str) -> Snapshot | None:
            return snap if repo == REPO else None

        def blob(self, sha256: str) -> Path | None:
            return tmp_path / sha256 if sha256 == f.sha256 else None

    @web.middleware
    async def anyone(request: web.Request, handler: Handler) -> web.StreamResponse:
        return await handler(request)

    async def fetch() -> bytes:
        app = web.Application()
        app.add_subapp("/hf", hub_app(One(), anyone))
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as s:
                url = server.make_url(f"/hf/{REPO}/resolve/main/model.safetensors")
                async with s.get(url, timeout=aiohttp.ClientTimeout(total=30)) as r:
                    return await r.read()
        finally:
            await server.close()

    assert uvloop.run(fetch()) == data
