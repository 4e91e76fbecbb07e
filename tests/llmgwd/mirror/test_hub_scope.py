"""/hf per key, as llmgwd mounts it (mirror.setup.hub): a user key lists and fetches only the
sets of the catalog's models it may use (its levels' model lists, as /v1 decides), anything else
a 404 as if it did not exist; staff keys (an admin key, a staff user's own key) see every set."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from llmgw.wire import ModelFile
from llmgwd.accounting.levels import LEVELS, LevelLimits, Levels, project_level
from llmgwd.catalog import Catalog, KeyOwner, Model
from llmgwd.mirror import setup
from llmgwd.mirror.records import Records
from llmgwd.mirror.service import Mirror, Settings
from llmgwd.mirror.snapshot import Snapshot
from llmgwd.people.directory import Directory
from llmgwd.router.metering import Meter
from llmgwd.store.sqlite import SqliteStore


def commit(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()


# repo -> (its commit, its files); TINY's model uses two of its three files, UNUSED backs none.
TINY, BIG, UNUSED = "acme/tiny", "acme/big", "acme/unused"
SETS: dict[str, tuple[str, dict[str, bytes]]] = {
    TINY: (
        commit("tiny"),
        {"config.json": b"{}\n", "tiny-Q4.gguf": b"q4" * 50, "tiny-Q8.gguf": b"q8" * 50},
    ),
    BIG: (commit("big"), {"big.gguf": b"big" * 40}),
    UNUSED: (commit("unused"), {"secret.gguf": b"secret" * 20}),
}
MODELS = {"tiny": (TINY, ("config.json", "tiny-Q4.gguf")), "big": (BIG, ("big.gguf",))}


def files_of(repo: str) -> list[ModelFile]:
    _, contents = SETS[repo]
    return [ModelFile(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in contents.items()]


@dataclass
class Hub:
    url: str  # the HF_ENDPOINT
    home: Path
    keys: dict[str, str] = field(default_factory=dict)


async def _fill(store: SqliteStore, catalog: Catalog, mirror: Mirror) -> dict[str, str]:
    """Every set whole in the mirror, the two models, and the keys: ann's narrowed to project
    acme/chat, whose level allows "tiny" only; an old user key (no maker, no level); an admin
    key; sam's own key, a staff viewer's."""
    for repo, (sha, contents) in SETS.items():
        for data in contents.values():
            blob = mirror.store.path(hashlib.sha256(data).hexdigest())
            blob.write_bytes(data)
        await mirror.records.put_snapshot(Snapshot(repo=repo, commit=sha, files=files_of(repo)))
        await mirror.records.put_ref(repo, "main", sha)
    for name, (repo, paths) in MODELS.items():
        files = [f for f in files_of(repo) if f.path in paths]
        source = f"hf:{repo}@{SETS[repo][0]}:*.gguf"
        await catalog.add_model(Model(name=name, source=source, files=files))
    people = Directory(store)
    await people.create_org("acme")
    await people.create_project("acme", "chat")
    ann, sam = await people.create_user("ann"), await people.create_user("sam")
    await people.set_staff(sam.id, "viewer")
    level = LevelLimits(models=["tiny"])
    await store.put(LEVELS + project_level("acme", "chat"), msgspec.json.encode(level))
    await catalog.load()  # the users, the level and the project, as the watch would bring them
    owner = KeyOwner(user=ann.id, org="acme", project="chat")
    return {
        "ann": (await catalog.create_key("ann", owner=owner))[1],
        "old": (await catalog.create_key("old"))[1],
        "admin": (await catalog.create_key("ops", "admin"))[1],
        "sam": (await catalog.create_key("sam", owner=KeyOwner(user=sam.id)))[1],
    }


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Hub]:
    store = await SqliteStore.open(":memory:")
    levels = Levels()
    catalog = Catalog(store, followers=(levels,))
    await catalog.load()
    mirror = Mirror(
        Settings(dir=tmp_path / "mirror", upstream="http://127.0.0.1:9"), Records(store)
    )
    await mirror.start()
    app = web.Application()
    app.add_subapp("/hf", setup.hub(mirror, catalog, Meter(levels=levels).allows))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    hub = Hub(url=str(server.make_url("/hf")), home=tmp_path / "hf-home")
    hub.keys = await _fill(store, catalog, mirror)
    yield hub
    await server.close()
    await mirror.close()
    await store.close()


async def get(hub: Hub, who: str, path: str) -> tuple[int, dict[str, str], Any]:
    url = URL(hub.url + path, encoded=True)
    headers = {"Authorization": f"Bearer {hub.keys[who]}"}
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        body = await r.read()
        try:
            return r.status, dict(r.headers), json.loads(body)
        except ValueError:
            return r.status, dict(r.headers), body


async def listed(hub: Hub, who: str) -> dict[str, list[str]]:
    status, _, body = await get(hub, who, "/api/llmgw/snapshots")
    assert status == 200, body
    return {s["repo"]: sorted(f["path"] for f in s["files"]) for s in body}


async def test_a_user_key_lists_only_the_sets_of_the_models_it_may_use(hub: Hub) -> None:
    every = {repo: sorted(contents) for repo, (_, contents) in SETS.items()}
    assert await listed(hub, "admin") == every
    assert await listed(hub, "sam") == every  # a staff viewer's own key
    tiny = ["config.json", "tiny-Q4.gguf"]  # the model's files, not the whole repository
    assert await listed(hub, "old") == {TINY: tiny, BIG: ["big.gguf"]}  # every model, no more
    assert await listed(hub, "ann") == {TINY: tiny}  # its project's level allows "tiny" only


@pytest.mark.parametrize(
    ("path", "code"),
    [
        (f"/{BIG}/resolve/main/big.gguf", "RepoNotFound"),
        (f"/{BIG}/resolve/{SETS[BIG][0]}/big.gguf", "RepoNotFound"),
        (f"/api/models/{BIG}", "RepoNotFound"),
        (f"/api/models/{BIG}/tree/main", "RepoNotFound"),
        (f"/{UNUSED}/resolve/main/secret.gguf", "RepoNotFound"),
        (f"/api/models/{UNUSED}/revision/{SETS[UNUSED][0]}", "RepoNotFound"),
        (f"/{TINY}/resolve/main/tiny-Q8.gguf", "EntryNotFound"),  # another set's file
    ],
)
async def test_what_a_user_key_may_not_use_is_a_404_as_if_absent(
    hub: Hub, path: str, code: str
) -> None:
    status, headers, body = await get(hub, "ann", path)
    assert (status, headers["X-Error-Code"]) == (404, code), body
    for staff in ("admin", "sam"):
        status, _, body = await get(hub, staff, path)
        assert status == 200, body


async def test_model_info_shows_a_user_key_its_set_only(hub: Hub) -> None:
    status, _, info = await get(hub, "ann", f"/api/models/{TINY}")
    assert status == 200 and info["sha"] == SETS[TINY][0] and info["gated"] is False
    assert sorted(s["rfilename"] for s in info["siblings"]) == ["config.json", "tiny-Q4.gguf"]
    status, _, tree = await get(hub, "ann", f"/api/models/{TINY}/tree/main")
    assert status == 200 and sorted(e["path"] for e in tree) == ["config.json", "tiny-Q4.gguf"]


async def python(hub: Hub, who: str, code: str) -> Any:
    """Client code run with HF_ENDPOINT and who's key; returns the JSON it prints last."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env = {k: v for k, v in env.items() if "proxy" not in k.lower()}
    env |= {
        "HF_ENDPOINT": hub.url,
        "HF_TOKEN": hub.keys[who],
        "HF_HOME": str(hub.home / who),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, out.decode()
    return json.loads(out.decode().strip().splitlines()[-1])


CLIENT = """
import json, os
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError
def get(repo):
    try:
        folder = snapshot_download(repo)
    except HfHubHTTPError as e:
        return [type(e).__name__, e.response.status_code]
    return sorted(os.listdir(folder))
print(json.dumps({repo: get(repo) for repo in %r}))
"""


async def test_huggingface_hub_downloads_a_user_its_sets_and_finds_no_other(hub: Hub) -> None:
    got = await python(hub, "ann", CLIENT % [TINY, BIG, UNUSED])
    assert got == {
        TINY: ["config.json", "tiny-Q4.gguf"],  # all its set holds, and nothing more
        BIG: ["RepositoryNotFoundError", 404],
        UNUSED: ["RepositoryNotFoundError", 404],
    }
    got = await python(hub, "sam", CLIENT % [UNUSED])
    assert got == {UNUSED: ["secret.gguf"]}


async def test_a_key_of_bytes_not_utf8_is_refused_not_a_500(hub: Hub) -> None:
    url = URL(hub.url)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    request = f"GET {url.path}/{TINY}/resolve/main/config.json HTTP/1.1\r\nHost: x\r\n"
    writer.write(request.encode() + b"Authorization: Bearer sk-llmgw-\xff\xfe\r\n\r\n")
    status = await reader.readline()
    writer.close()
    assert status.split()[1] == b"401", status
