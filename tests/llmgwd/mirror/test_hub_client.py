"""The mirror's client of its upstream (issue 10): real answers of huggingface.co, recorded (see
recorded/README.md), parsed; resolve end to end against a fake hub on loopback that replays them."""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.typedefs import Handler
from huggingface_hub import hf_hub_url

from llmgw.wire import ModelFile
from llmgwd.mirror import hub_client
from llmgwd.mirror.hub_client import HubError, read_token, resolve, resolve_url
from llmgwd.mirror.hub_server import hub_app
from llmgwd.mirror.snapshot import Snapshot

RECORDED = Path(__file__).parent / "recorded"
REPO = "OwnerOfTheGatedModel/tiny-gated-model"
COMMIT = "5bb9fc53add422c252f7351a8e28c438cb98ea21"
LFS_SHA = "321019a3b5ea40a247b2cd8db89a7f2dd7bbfe6aeab29c92fc5f58e098cef177"
TOKEN = "hf_notARealTokenButSecretAll"  # the test's "secret": never in a message
INFO = f"/api/models/{REPO}/revision/main"
TREE = f"/api/models/{REPO}/tree/{COMMIT}?recursive=true&expand=false"
PAGE2 = f"{TREE}&cursor=2"

# What the recorded repository holds at COMMIT, every directory (the hub's recursive listing).
FILES = [
    ModelFile(".gitattributes", 1519, git_oid="a6344aac8c09253b3b630fb776ae94478aa0275b"),
    ModelFile("README.md", 201, git_oid="0c14ad74222fd13bc2b768196169ee7285f2f1c0"),
    ModelFile("checkpoint-0/config.json", 819, git_oid="1a78b7e6c35fa843b214689706ce9398ac8fc761"),
    ModelFile(
        "checkpoint-0/generation_config.json",
        195,
        git_oid="ad61e9690fadc7132837a8a037197af97061bd5f",
    ),
    ModelFile("checkpoint-0/model.safetensors", 691784, sha256=LFS_SHA),
]


def records(name: str) -> dict[str, dict[str, Any]]:
    """A recording of the hub's answers (originator's probe format), by the id of each."""
    data = json.loads((RECORDED / name).read_text(encoding="utf-8"))
    return {r["id"]: r for r in data["records"]}


SEED = records("originator-2026-10-06-clone-seed-reads.json")
MASKING = records("originator-2026-10-06-tree-masking.json")


def sent(record: dict[str, Any]) -> bytes:
    """The bytes the hub sent: its JSON compact, as the hub writes it (length checked below)."""
    return json.dumps(record["body_json"], separators=(",", ":")).encode()


def cassette(name: str) -> list[dict[str, Any]]:
    """The interactions of one of huggingface_hub's own VCR cassettes."""
    text = (RECORDED / f"huggingface_hub-InferenceApiTest.{name}.yaml").read_text("utf-8")
    interactions: list[dict[str, Any]] = yaml.safe_load(text)["interactions"]
    return interactions


@dataclass
class Answer:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def recorded_error(record: dict[str, Any]) -> Answer:
    """A recorded error answer: its status, its X-Error-* headers and its body."""
    keep = ("x-error-code", "x-error-message", "www-authenticate", "content-type")
    headers = {k: v for k, v in record["headers"].items() if k in keep}
    return Answer(record["status"], record["body_excerpt"].encode(), headers)


class FakeHub:
    """The hub's routes on loopback: answers by raw path (with the query), in turn."""

    def __init__(self) -> None:
        self.answers: dict[str, list[Answer]] = {}
        self.requests: list[tuple[str, str | None]] = []  # (raw path, Authorization)
        self.base = ""
        self.app = web.Application()
        self.app.router.add_route("GET", "/{tail:.*}", self.handle)

    def on(self, raw_path: str, *answers: Answer) -> None:
        self.answers[raw_path] = list(answers)

    def json(self, raw_path: str, body: object, headers: dict[str, str] | None = None) -> None:
        self.on(raw_path, Answer(200, json.dumps(body).encode(), headers or {}))

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((request.raw_path, request.headers.get("Authorization")))
        queue = self.answers.get(request.raw_path)
        if not queue:
            return web.json_response({"error": "not here"}, status=418)
        a = queue.pop(0) if len(queue) > 1 else queue[0]
        ctype = "application/json" if a.status < 300 else "text/plain"
        headers = {"Content-Type": ctype, **a.headers}
        return web.Response(status=a.status, body=a.body, headers=headers)

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]


@pytest.fixture
async def hub() -> AsyncIterator[FakeHub]:
    fake = FakeHub()
    server = TestServer(fake.app, host="127.0.0.1")
    await server.start_server()
    fake.base = str(server.make_url("")).rstrip("/")
    yield fake
    await server.close()


other_hub = hub  # a second fake hub, on another port: another origin


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def serve_recorded(hub: FakeHub, page2: str = "tree-subdir-owner", link: str = "") -> None:
    """The recorded repository: its model info, then its listing in two recorded pages (the
    top directory, then checkpoint-0), the first with the Link the hub paginates with."""
    hub.on(INFO, Answer(200, sent(SEED["model-info-owner"])))
    link = link or f'<{hub.base}{PAGE2}>; rel="next"'
    hub.on(TREE, Answer(200, sent(SEED["tree-main"]), {"Link": link}))
    hub.on(PAGE2, Answer(200, sent(MASKING[page2])))


async def refused(
    session: aiohttp.ClientSession, hub: FakeHub, token: str | None = TOKEN, revision: str = "main"
) -> HubError:
    with pytest.raises(HubError) as e:
        await resolve(session, hub.base, REPO, revision, token=token, backoff_s=0)
    assert TOKEN not in str(e.value)
    return e.value


# The recordings themselves.


def test_the_recorded_bodies_are_the_bytes_the_hub_sent() -> None:
    # Each body replayed is exactly as long as the hub said (Content-Length), and the git blob
    # ids the listing gives are those of the bytes the hub serves for the files (git hash-object).
    for record in [*SEED.values(), *MASKING.values()]:
        if "body_json" in record and not record["id"].startswith("whoami"):  # e-mail redacted
            assert len(sent(record)) == int(record["headers"]["content-length"]), record["id"]
    for rid in ("owner-readme", "owner-gitattributes", "owner-config"):
        data = SEED[rid]["body_text"].encode()
        blob_id = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        assert SEED[rid]["headers"]["etag"] == f'"{blob_id}"'
        assert any(f.git_oid == blob_id and f.size == len(data) for f in FILES)


async def test_a_repository_resolves_with_every_directory_over_two_pages(
    hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    serve_recorded(hub)
    snap = await resolve(session, hub.base, REPO, "main", token=TOKEN)
    assert snap.repo == REPO and snap.commit == COMMIT
    assert snap.files == FILES  # the top directory and checkpoint-0/, from both pages
    assert snap.gated is True  # "gated": "manual"
    assert snap.last_modified == "2026-10-06T13:24:38.000Z"
    assert hub.requests == [(p, f"Bearer {TOKEN}") for p in (INFO, TREE, PAGE2)]


async def test_a_relative_next_link_is_followed(
    hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    serve_recorded(hub, link=f'<{PAGE2}>; rel="next"')
    snap = await resolve(session, hub.base, REPO, "main")
    assert snap.files == FILES
    assert hub.requests == [(p, None) for p in (INFO, TREE, PAGE2)]  # no token: no header


def test_the_lfs_sha256_is_the_one_the_hub_serves_the_file_under() -> None:
    head = SEED["owner-head-lfs"]["headers"]  # HEAD .../resolve/main/checkpoint-0/model.safetensors
    assert head["x-linked-etag"] == f'"{LFS_SHA}"'
    assert int(head["x-linked-size"]) == FILES[-1].size
    assert FILES[-1].git_oid == ""  # the entry's "oid" is the pointer's blob id: not kept


@pytest.mark.parametrize(
    ("name", "repo", "sha", "modified"),
    [
        (
            "test_simple_inference",
            "google-bert/bert-base-uncased",
            "86b5e0934494bd15c9632b12f734a8a67f723594",
            "2024-02-19T11:06:12.000Z",
        ),
        (
            "test_text_to_image",
            "stabilityai/stable-diffusion-2-1",
            "5cae40e6a2745ae2b01ad92ae5043f95f23644d6",
            "2023-07-05T16:19:17.000Z",
        ),
    ],
)
async def test_recorded_model_infos_of_huggingface_hub_s_cassettes(
    hub: FakeHub, session: aiohttp.ClientSession, name: str, repo: str, sha: str, modified: str
) -> None:
    final = [i for i in cassette(name) if i["request"]["uri"].endswith(f"/api/models/{repo}")]
    assert final[0]["response"]["status"]["code"] == 200
    hub.on(
        f"/api/models/{repo}/revision/main",
        Answer(200, final[0]["response"]["body"]["string"].encode()),
    )
    hub.json(f"/api/models/{repo}/tree/{sha}?recursive=true&expand=false", [])
    snap = await resolve(session, hub.base, repo, "main")
    assert (snap.commit, snap.last_modified, snap.gated, snap.files) == (sha, modified, False, [])


async def test_a_renamed_repository_is_followed_on_the_same_host(
    hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    # The hub answers a renamed repository with a 307 to its new name, a path on the same host
    # (recorded in huggingface_hub's cassette: bert-base-uncased -> google-bert/...).
    moved = cassette("test_simple_inference")[0]["response"]
    assert moved["status"]["code"] == 307
    assert moved["headers"]["Location"] == ["/api/models/google-bert/bert-base-uncased"]
    old = "acme/old-name"
    serve_recorded(hub)
    hub.on(f"/api/models/{old}/revision/main", Answer(307, b"", {"Location": INFO}))
    old_tree = f"/api/models/{old}/tree/{COMMIT}?recursive=true&expand=false"
    hub.on(old_tree, Answer(307, b"", {"Location": TREE}))
    snap = await resolve(session, hub.base, old, "main", token=TOKEN)
    assert snap.repo == old and snap.commit == COMMIT and snap.files == FILES
    assert hub.requests == [
        (p, f"Bearer {TOKEN}")
        for p in (f"/api/models/{old}/revision/main", INFO, old_tree, TREE, PAGE2)
    ]


# Refusals from the hub.


async def test_a_gated_repository_listed_anonymously_hides_its_checksums(
    hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    serve_recorded(hub, page2="tree-subdir-anon")  # lfs.oid "****...": the hub masks it
    err = await refused(session, hub, token=None)
    assert err.status == 401
    assert "hides its checksums" in str(err) and "mirror.token_file" in str(err)
    serve_recorded(hub, page2="tree-subdir-requester")  # a token without access: masked too
    err = await refused(session, hub)
    assert err.status == 403 and "no access" in str(err)


async def test_401_gated_says_a_token_is_needed(
    hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    hub.on(INFO, recorded_error(MASKING["raw-readme-anon"]))  # 401, X-Error-Code: GatedRepo
    err = await refused(session, hub, token=None)
    assert err.status == 401
    assert str(err).startswith(
        f"hf:{REPO}: the upstream answered 401: a token is needed (gated repository); "
        "put one in mirror.token_file"
    )


async def test_403_gated_says_the_token_has_no_access(
    hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    hub.on(INFO, recorded_error(MASKING["raw-readme-requester"]))  # 403 GatedRepo, pending
    err = await refused(session, hub)
    assert err.status == 403 and "no access to this gated repository" in str(err)
    assert "awaiting a review from the repo authors" in str(err)  # the hub's X-Error-Message


async def test_404_no_such_repository(hub: FakeHub, session: aiohttp.ClientSession) -> None:
    hub.on(INFO, recorded_error(SEED["owner-unknown-repo-list"]))  # 404 RepoNotFound
    err = await refused(session, hub)
    assert err.status == 404 and "no such repository" in str(err)
    assert hub.paths() == [INFO]  # a 404 is not retried


async def test_404_no_such_revision(hub: FakeHub, session: aiohttp.ClientSession) -> None:
    # Built from huggingface_hub's hf_raise_for_status: X-Error-Code RevisionNotFound, a 404.
    path = f"/api/models/{REPO}/revision/nope"
    hub.on(
        path, Answer(404, b'{"error":"Invalid rev id: nope"}', {"X-Error-Code": "RevisionNotFound"})
    )
    err = await refused(session, hub, revision="nope")
    assert err.status == 404 and "no such revision" in str(err)


async def test_401_with_a_token_never_shows_the_token(
    hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    hub.on(INFO, Answer(401, b"", {"X-Error-Message": f"Invalid token {TOKEN}"}))
    err = await refused(session, hub)
    assert err.status == 401 and "refused the token" in str(err) and "***" in str(err)


async def test_5xx_is_retried_then_succeeds(hub: FakeHub, session: aiohttp.ClientSession) -> None:
    serve_recorded(hub)
    hub.on(INFO, Answer(503), Answer(502), Answer(200, sent(SEED["model-info-owner"])))
    snap = await resolve(session, hub.base, REPO, "main", backoff_s=0)
    assert snap.files == FILES and hub.paths() == [INFO, INFO, INFO, TREE, PAGE2]


async def test_5xx_gives_up_after_the_tries(hub: FakeHub, session: aiohttp.ClientSession) -> None:
    hub.on(INFO, Answer(503))
    with pytest.raises(HubError) as e:
        await resolve(session, hub.base, REPO, "main", tries=3, backoff_s=0)
    assert e.value.status == 503 and hub.paths() == [INFO] * 3


async def test_an_unreachable_upstream_is_status_0(session: aiohttp.ClientSession) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(HubError) as e:
        await resolve(session, f"http://127.0.0.1:{port}", REPO, "main", tries=2, backoff_s=0)
    assert e.value.status == 0 and "cannot reach the upstream" in str(e.value)


# Answers refused: nothing the upstream says chooses where the gateway connects.


async def test_a_next_link_to_another_host_is_refused(
    hub: FakeHub, other_hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    serve_recorded(hub, link=f'<{other_hub.base}{PAGE2}>; rel="next"')
    serve_recorded(other_hub)
    err = await refused(session, hub)
    assert err.status == hub_client.MALFORMED and "another host" in str(err)
    assert other_hub.requests == []  # never asked (and never sent the token)


async def test_a_redirect_to_another_host_is_refused(
    hub: FakeHub, other_hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    hub.on(INFO, Answer(302, b"", {"Location": f"{other_hub.base}{INFO}"}))
    serve_recorded(other_hub)
    err = await refused(session, hub)
    assert "redirected to another host" in str(err) and other_hub.requests == []


async def test_a_next_link_back_to_a_page_already_given_is_refused(
    hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    serve_recorded(hub, link=f'<{hub.base}{TREE}>; rel="next"')
    err = await refused(session, hub)
    assert "already gave" in str(err) and hub.paths() == [INFO, TREE]


async def test_a_malformed_commit_is_refused(hub: FakeHub, session: aiohttp.ClientSession) -> None:
    info = json.loads(sent(SEED["model-info-owner"]))
    for sha in ("5bb9fc53", COMMIT.upper(), f"{COMMIT}/../x", 12):
        serve_recorded(hub)
        hub.json(INFO, {**info, "sha": sha})
        err = await refused(session, hub)
        assert err.status == hub_client.MALFORMED, sha


async def test_a_commit_asked_for_must_be_the_commit_answered(
    hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    other = "0" * 40
    hub.on(f"/api/models/{REPO}/revision/{other}", Answer(200, sent(SEED["model-info-owner"])))
    err = await refused(session, hub, revision=other)
    assert f"named commit {COMMIT} for commit {other}" in str(err)


def entry(path: str = "x.json", **over: object) -> dict[str, object]:
    return {"type": "file", "oid": "1" * 40, "size": 3, "path": path, **over}


@pytest.mark.parametrize(
    ("page2", "why"),
    [
        ([entry("../outside")], "'..'"),
        ([entry("checkpoint-0/../../etc/passwd")], "'..'"),
        ([entry("/etc/passwd")], "absolute"),
        ([entry("a\x00b")], "control character"),
        ([entry("a\nb")], "control character"),
        ([entry("a//b")], "empty"),
        ([entry("./a")], "'.'"),
        ([entry("")], "empty"),
        ([entry("README.md")], "twice"),  # already on page 1
        ([entry(), entry()], "twice"),
        ([entry(size=-1)], "size"),
        ([entry(size="819")], "size"),
        ([entry(size=1.5)], "size"),
        ([entry(oid="abc")], "git blob id"),
        ([entry(lfs={"oid": "ab" * 31, "size": 3, "pointerSize": 130})], "sha256"),
        ([entry(lfs={"oid": LFS_SHA, "size": -3})], "size"),
        ([entry(type="symlink")], "type"),
        ([{"type": "file", "oid": "1" * 40, "size": 3}], "path"),
        ({"entries": []}, "malformed"),
        ([entry(llmgw_sha256="beef")], "llmgw_sha256"),
        ([entry(lfs={"oid": LFS_SHA, "size": 3}, llmgw_sha256="0" * 64)], "two different"),
    ],
)
async def test_a_malformed_listing_is_refused_naming_the_problem(
    hub: FakeHub, session: aiohttp.ClientSession, page2: object, why: str
) -> None:
    serve_recorded(hub)
    hub.json(PAGE2, page2)
    err = await refused(session, hub)
    assert err.status == hub_client.MALFORMED and why in str(err), str(err)


async def test_a_page_that_is_not_json_is_refused(
    hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    serve_recorded(hub)
    hub.on(PAGE2, Answer(200, b"<html>maintenance</html>"))
    err = await refused(session, hub)
    assert err.status == hub_client.MALFORMED and "not JSON" in str(err)


# The llmgw extension: a mirror's sha256 of a file the hub gives none for.


async def test_an_llmgw_mirror_s_sha256_is_recorded(
    hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    assert hub_client.EXTENSION_KEY == "llmgw_sha256"
    data = SEED["owner-config"]["body_text"].encode()
    sha = hashlib.sha256(data).hexdigest()
    page = json.loads(sent(MASKING["tree-subdir-owner"]))
    page[0]["llmgw_sha256"] = sha  # checkpoint-0/config.json, not in LFS
    page[2]["llmgw_sha256"] = LFS_SHA  # the LFS file: the same sha256, as an llmgw mirror says
    serve_recorded(hub)
    hub.json(PAGE2, page)
    snap = await resolve(session, hub.base, REPO, "main")
    config = snap.file("checkpoint-0/config.json")
    assert config == ModelFile(
        "checkpoint-0/config.json", 819, sha256=sha, git_oid=FILES[2].git_oid
    )
    assert snap.file("checkpoint-0/model.safetensors") == FILES[-1]
    assert snap.file("README.md") == FILES[1]  # none given: none recorded


class Held:
    """What an llmgw mirror holds: one snapshot, by "main" or by its commit."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def snapshot(self, repo: str, revision: str) -> Snapshot | None:
        ok = repo == self.snap.repo and revision in ("main", self.snap.commit)
        return self.snap if ok else None

    def blob(self, sha256: str) -> Path | None:
        return None


@web.middleware
async def anyone(request: web.Request, handler: Handler) -> web.StreamResponse:
    return await handler(request)


async def test_another_llmgw_mirror_is_read_with_its_sha256s(
    session: aiohttp.ClientSession,
) -> None:
    # The upstream is an llmgw mirror (its /hf, two entries a page): the sha256 it recorded for
    # a file the hub gives none for comes back through EXTENSION_KEY; the rest as from the hub.
    config = ModelFile(FILES[2].path, 819, sha256="5" * 64, git_oid=FILES[2].git_oid)
    files = [*FILES[:2], config, *FILES[3:]]
    held = Snapshot(repo=REPO, commit=COMMIT, files=files, last_modified="2026-10-06T13:24:38Z")
    root = web.Application()
    root.add_subapp("/hf", hub_app(Held(held), anyone, page_size=2))
    server = TestServer(root, host="127.0.0.1")
    await server.start_server()
    try:
        snap = await resolve(session, str(server.make_url("/hf")), REPO, "main")
    finally:
        await server.close()
    assert (snap.commit, snap.files, snap.gated) == (COMMIT, files, False)
    assert snap.last_modified == "2026-10-06T13:24:38.000Z"


# URLs and input.


async def test_a_revision_is_quoted_whole_as_huggingface_hub_does(
    hub: FakeHub, session: aiohttp.ClientSession
) -> None:
    path = f"/api/models/{REPO}/revision/refs%2Fpr%2F1"  # quote("refs/pr/1", safe="")
    hub.on(path, Answer(200, sent(SEED["model-info-owner"])))
    hub.on(TREE, Answer(200, sent(SEED["tree-main"])))
    snap = await resolve(session, hub.base, REPO, "refs/pr/1")
    assert snap.commit == COMMIT and hub.paths() == [path, TREE]


@pytest.mark.parametrize(
    ("repo", "revision"),
    [("../x", "main"), ("org/repo?x=1", "main"), ("org/repo", "main?x"), ("org", "main")],
)
async def test_a_bad_repository_or_revision_is_never_sent(
    hub: FakeHub, session: aiohttp.ClientSession, repo: str, revision: str
) -> None:
    with pytest.raises(HubError) as e:
        await resolve(session, hub.base, repo, revision)
    assert e.value.status == 400 and hub.requests == []


@pytest.mark.parametrize(
    "path",
    ["model.gguf", "sub dir/a#b?.json", "onnx/model 100%.onnx", "ünï/cödé.bin", "a/b/c/d.txt"],
)
@pytest.mark.parametrize("endpoint", ["https://huggingface.co", "http://gw:7700/hf/"])
def test_resolve_url_is_the_official_client_s(endpoint: str, path: str) -> None:
    ours = resolve_url(endpoint, REPO, COMMIT, path)
    official = hf_hub_url(REPO, path, revision=COMMIT, endpoint=endpoint.rstrip("/"))
    assert ours == official


def test_read_token(tmp_path: Path) -> None:
    f = tmp_path / "token"
    assert read_token(str(f)) is None  # missing
    f.write_text("")
    assert read_token(str(f)) is None
    f.write_text("  \n")
    assert read_token(str(f)) is None
    f.write_text(f"  {TOKEN} \nsecond line\n")
    assert read_token(str(f)) == TOKEN
