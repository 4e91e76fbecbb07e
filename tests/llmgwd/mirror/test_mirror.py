"""The mirror end to end in one process: mirror A filled by an import serves /hf; mirror B,
with A as its upstream, pins hf:ORG/REPO@main, fetches the set checked, and a sweep frees it;
a peer copies A's whole sets and drops what A drops; all through /api/v1 as the CLI calls it."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.typedefs import Handler

from llmgwd.api.base import ApiContext, NodeInfo
from llmgwd.api.routes import api_subapp
from llmgwd.auth import PRINCIPAL, Principal
from llmgwd.catalog import Catalog
from llmgwd.mirror import hub_server, peers, setup
from llmgwd.mirror.records import Records
from llmgwd.mirror.service import Mirror, Settings
from llmgwd.store.sqlite import SqliteStore

REPO = "acme/tiny-gguf"
GGUF = Path(__file__).resolve().parents[1] / "gguf" / "smollm2-135m-instruct-q4_1.copied.gguf"
FILES: dict[str, bytes] = {
    "README.md": b"# tiny\n",
    "notes/params.json": b'{"temperature": 0.2}\n',
    "tiny-Q4_1.gguf": GGUF.read_bytes(),
    "tiny-Q8_0.gguf": GGUF.read_bytes()[::-1],  # another quantization, not chosen below
}


class NoNodes:
    def nodes(self) -> list[NodeInfo]:
        return []


@web.middleware
async def anyone(request: web.Request, handler: Handler) -> web.StreamResponse:
    request[PRINCIPAL] = Principal("test", staff="admin")
    return await handler(request)


@dataclass
class Site:
    """One llmgwd's mirror and catalog, with /api/v1 and /hf on a loopback port."""

    mirror: Mirror
    catalog: Catalog
    server: TestServer
    session: aiohttp.ClientSession

    @property
    def hf(self) -> str:
        return str(self.server.make_url("/hf"))

    async def call(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        url = self.server.make_url("/api/v1" + path)
        async with self.session.request(method, url, json=body) as r:
            return r.status, await r.json()

    async def upload(self, path: str, data: bytes) -> None:
        sha = hashlib.sha256(data).hexdigest()
        url = self.server.make_url(f"/api/v1/mirror/uploads/{sha}")
        async with self.session.put(url, data=data) as r:
            assert r.status == 201, await r.text()


async def _site(tmp: Path, upstream: str = "http://127.0.0.1:9/hf") -> Site:
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    mirror = Mirror(Settings(dir=tmp, upstream=upstream, parallel=2), Records(store))
    await mirror.start()
    setup.follow_catalog(mirror, catalog)
    ctx = ApiContext(
        catalog=catalog, nodes=NoNodes(), mint_token=lambda: "t", join_url="x", mirror=mirror
    )
    app = web.Application()
    app.add_subapp("/api/v1", api_subapp(ctx, anyone))
    hub = hub_server.hub_app(mirror, anyone)
    hub.router.add_get(peers.LISTING, peers.listing_handler(mirror))
    app.add_subapp("/hf", hub)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return Site(mirror, catalog, server, aiohttp.ClientSession())


@pytest.fixture
async def sites(tmp_path: Path) -> AsyncIterator[tuple[Site, Site]]:
    a = await _site(tmp_path / "a")
    b = await _site(tmp_path / "b", upstream=a.hf)
    yield a, b
    for s in (b, a):
        await s.session.close()
        await s.mirror.close()
        await s.server.close()


async def _import(a: Site) -> dict[str, Any]:
    files = []
    for path, data in FILES.items():
        await a.upload(path, data)
        git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() if len(data) < 1000 else ""
        files.append(
            {
                "path": path,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "git_oid": git,
            }
        )
    status, out = await a.call("POST", "/mirror/import", {"repo": REPO, "files": files})
    assert status == 201, out
    return dict(out)


async def _fetched(site: Site, name: str) -> dict[str, Any]:
    for _ in range(200):
        _status, m = await site.call("GET", f"/models/{name}")
        if m.get("mirror") is None or m["mirror"]["state"] != "fetching":
            return dict(m)
        await asyncio.sleep(0.05)
    raise AssertionError("the set was not fetched")


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


async def test_second_mirror_pins_fetches_checks_and_sweeps(sites: tuple[Site, Site]) -> None:
    a, b = sites
    imported = await _import(a)
    status, m = await b.call(
        "POST",
        "/models",
        {"name": "tiny", "engine": "llama.cpp", "source": f"hf:{REPO}@main:*Q4_1.gguf"},
    )
    assert status == 201, m
    assert m["source"] == f"hf:{REPO}@{imported['commit']}:*Q4_1.gguf"  # pinned
    assert (m["files"], m["bytes"]) == (1, len(FILES["tiny-Q4_1.gguf"]))
    m = await _fetched(b, "tiny")
    assert m["mirror"] is None or m["mirror"]["state"] == "done"
    sha = hashlib.sha256(FILES["tiny-Q4_1.gguf"]).hexdigest()
    assert (b.mirror.settings.dir / "blobs" / sha).read_bytes() == FILES["tiny-Q4_1.gguf"]
    for _ in range(100):  # read from the mirror's copy once fetched
        if (await b.call("GET", "/models/tiny"))[1]["shape_note"] == "":
            break
        await asyncio.sleep(0.05)
    assert b.catalog.get("tiny").shape is not None  # type: ignore[union-attr]
    # Removing it with its files frees exactly what was on disk.
    before = _du(b.mirror.settings.dir / "blobs")
    status, out = await b.call("DELETE", "/models/tiny?files=true")
    assert status == 200, out
    assert out["files"]["bytes"] == before - _du(b.mirror.settings.dir / "blobs") > 0


async def test_no_pattern_with_several_ggufs_is_refused_naming_them(
    sites: tuple[Site, Site],
) -> None:
    a, b = sites
    await _import(a)
    status, out = await b.call(
        "POST", "/models", {"name": "tiny", "engine": "llama.cpp", "source": f"hf:{REPO}@main"}
    )
    assert status == 400
    assert "tiny-Q4_1.gguf" in out["error"]["message"] and "PATTERN" in out["error"]["message"]


async def test_a_byte_changed_upstream_is_refused_and_nothing_published(
    sites: tuple[Site, Site],
) -> None:
    a, b = sites
    await _import(a)
    sha = hashlib.sha256(FILES["tiny-Q4_1.gguf"]).hexdigest()
    blob = a.mirror.settings.dir / "blobs" / sha
    data = bytearray(blob.read_bytes())
    data[1000] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))  # the upstream now serves a corrupt copy
    status, m = await b.call(
        "POST",
        "/models",
        {"name": "tiny", "engine": "llama.cpp", "source": f"hf:{REPO}@main:*Q4_1.gguf"},
    )
    assert status == 201
    m = await _fetched(b, "tiny")
    assert m["mirror"]["state"] == "failed"
    assert "sha256" in m["mirror"]["error"]
    assert not (b.mirror.settings.dir / "blobs" / sha).exists()
    assert list((b.mirror.settings.dir / "partial").glob("*.refused"))  # kept aside


async def test_sweep_frees_what_no_model_uses(sites: tuple[Site, Site]) -> None:
    a, _ = sites
    await _import(a)
    blobs = a.mirror.settings.dir / "blobs"
    total = _du(blobs)
    _, dry = await a.call("POST", "/mirror/sweep", {"dry_run": True})
    assert (dry["files"], dry["bytes"]) == (len(FILES), total)
    assert _du(blobs) == total
    _status, done = await a.call("POST", "/mirror/sweep", {})
    assert done["bytes"] == total and _du(blobs) == 0


async def test_a_peer_copies_whole_sets_and_drops_what_its_peer_drops(
    sites: tuple[Site, Site], tmp_path: Path
) -> None:
    a, _ = sites
    await _import(a)
    c = await _site(tmp_path / "c")
    try:
        status, peer = await c.call("POST", "/mirror/peers", {"url": a.hf})
        assert status == 201, peer
        for _ in range(200):
            if c.mirror.records.ref(REPO, "main"):
                break
            await asyncio.sleep(0.05)
        snap = c.mirror.snapshot(REPO, "main")
        assert snap is not None and all(f.sha256 for f in snap.files)
        assert {c.mirror.store.path(f.sha256).read_bytes() for f in snap.files} == set(
            FILES.values()
        )
        await a.call("POST", "/mirror/sweep", {})  # A drops it
        await peers.sync(c.mirror, c.mirror.records.peers()[0])
        assert c.mirror.snapshot(REPO, "main") is None and c.mirror.store.held() == []
    finally:
        await c.session.close()
        await c.mirror.close()
        await c.server.close()


async def test_an_imported_set_is_served_without_the_upstream(sites: tuple[Site, Site]) -> None:
    """An air-gapped site: the upstream cannot be reached, the imported ref is the mirror's."""
    a, _ = sites
    imported = await _import(a)
    status, m = await a.call(
        "POST",
        "/models",
        {"name": "tiny", "engine": "llama.cpp", "source": f"hf:{REPO}:*Q4_1.gguf"},
    )
    assert status == 201, m
    assert m["source"] == f"hf:{REPO}@{imported['commit']}:*Q4_1.gguf"
    assert m["mirror"] is None  # nothing to fetch: the mirror holds the set
