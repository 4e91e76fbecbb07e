"""The mirror across control planes: three Mirrors over one store, each with its cluster port
(mutual TLS, the cluster CA), one fake upstream counting what it sends. A set is fetched from
upstream once and copied by the others; a claimant that dies mid-fetch is taken over; a copy
goes to the next holder when one lacks a file; only a control plane's certificate is let in."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp import web

from llmgw import pki, wire
from llmgw.wire import ModelFile
from llmgwd.mirror import node_files, setup
from llmgwd.mirror.holders import CLAIMS
from llmgwd.mirror.records import Records
from llmgwd.mirror.service import Mirror, Settings
from llmgwd.nodes.port import server_ssl_context
from llmgwd.planes import registry
from llmgwd.store.sqlite import SqliteStore

REPO, COMMIT = "acme/big", "b" * 40
SOURCE = f"hf:{REPO}@{COMMIT}"
BIG = bytes((i * 13) % 251 for i in range(4 << 20))
SMALL = b'{"model_type": "llama"}\n'
FILES = [
    ModelFile(path=p, size=len(d), sha256=hashlib.sha256(d).hexdigest())
    for p, d in (("model.safetensors", BIG), ("config.json", SMALL))
]
DATA = {"model.safetensors": BIG, "config.json": SMALL}


@dataclass
class Upstream:
    """The hub: serves each file, counting the requests; can hold the first answer of BIG."""

    requests: Counter[str] = field(default_factory=Counter)
    hold: asyncio.Event | None = None
    held: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        path = request.match_info["path"]
        self.requests[path] += 1
        data = DATA[path]
        resp = web.StreamResponse()
        resp.content_length = len(data)
        await resp.prepare(request)
        if path == "model.safetensors" and self.hold is not None:
            hold, self.hold = self.hold, None
            await resp.write(data[: 1 << 20])
            self.held.set()
            await hold.wait()  # the claimant dies meanwhile
            return resp
        await resp.write(data)
        await resp.write_eof()
        return resp


@dataclass
class Plane:
    name: str
    mirror: Mirror
    lease: int
    url: str = ""

    def holds(self) -> bool:
        return all(self.mirror.store.has(f.sha256) for f in FILES)


@dataclass
class Cluster:
    store: SqliteStore
    ca: pki.CertKey
    upstream: Upstream
    planes: list[Plane]
    tmp: Path


async def _refuse_nodes(_: web.Request) -> str | web.Response:
    return web.json_response({"error": "no node here", "code": "refused"}, status=403)


async def _plane(c: Cluster, name: str, runners: list[web.AppRunner]) -> Plane:
    lease = await c.store.lease_grant(30)
    mirror = Mirror(Settings(dir=c.tmp / name, upstream=c.upstream.url), Records(c.store))
    await mirror.start()
    plane = Plane(name, mirror, lease)
    spec = setup.Plane(name, c.ca, lambda: plane.lease)
    setup.join_fleet(mirror, c.store, spec, c.tmp / name / "pki", wait_s=0.05)
    app = web.Application()
    node_files.add_routes(app, mirror, _refuse_nodes)
    cert, key = c.tmp / f"{name}.pem", c.tmp / f"{name}.key"
    pki.write_pair(pki.make_server_cert(c.ca, ["localhost"], ["127.0.0.1"]), cert, key)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(
        runner, "127.0.0.1", 0, ssl_context=server_ssl_context(c.ca.cert_pem, cert, key)
    )
    await site.start()
    runners.append(runner)
    plane.url = f"https://localhost:{runner.addresses[0][1]}"
    info = msgspec.json.encode(wire.PlaneInfo(name, plane.url))
    await c.store.put(registry.SERVERS + name, info, lease=lease)  # as its Announcer does
    return plane


@pytest.fixture
async def three(tmp_path: Path) -> AsyncIterator[Cluster]:
    up = Upstream()
    app = web.Application()
    app.router.add_get("/hf/{org}/{repo}/resolve/{commit}/{path}", up.resolve)
    hub = web.AppRunner(app, shutdown_timeout=0.1)
    await hub.setup()
    await web.TCPSite(hub, "127.0.0.1", 0).start()
    up.url = f"http://127.0.0.1:{hub.addresses[0][1]}/hf"
    store = await SqliteStore.open(":memory:")
    c = Cluster(store, pki.make_ca(), up, [], tmp_path)
    runners: list[web.AppRunner] = [hub]
    for name in ("cp1", "cp2", "cp3"):
        c.planes.append(await _plane(c, name, runners))
    yield c
    if up.hold is not None:
        up.hold.set()
    for p in c.planes:
        await p.mirror.close()
    for r in runners:
        await r.cleanup()
    await store.close()


async def until(check: Callable[[], object]) -> None:
    async with asyncio.timeout(20):
        while not check():  # noqa: ASYNC110 (the mirrors' jobs have no event to wait on)
            await asyncio.sleep(0.02)


async def holders(plane: Plane, want: list[str]) -> list[tuple[str, list[str], str]]:
    """`llmgw mirror status`'s sets as plane says them, once want hold SOURCE (each marks it
    just after its files are in)."""
    fleet = plane.mirror.fleet
    assert fleet is not None
    async with asyncio.timeout(20):
        while True:
            held = [(h.source, sorted(h.planes), h.fetching) for h in await fleet.held([SOURCE])]
            if held and held[0][1] == want:
                return held
            await asyncio.sleep(0.02)


async def test_a_set_is_fetched_upstream_once_and_ends_up_on_every_control_plane(
    three: Cluster,
) -> None:
    cp1, cp2, cp3 = three.planes
    cp1.mirror.fetch(SOURCE, FILES)  # the control plane asked
    await asyncio.sleep(0)
    for p in (cp2, cp3):  # the others, as the catalog's change reaches them
        p.mirror.fetch(SOURCE, FILES)
    await until(lambda: all(p.holds() for p in three.planes))
    assert three.upstream.requests == {"model.safetensors": 1, "config.json": 1}
    for p in three.planes:
        assert p.mirror.blob(FILES[0].sha256) is not None
        assert p.mirror.blob(FILES[0].sha256).read_bytes() == BIG  # type: ignore[union-attr]
    assert await holders(cp2, ["cp1", "cp2", "cp3"]) == [(SOURCE, ["cp1", "cp2", "cp3"], "")]


async def test_the_fetching_control_plane_dying_mid_fetch_is_taken_over(three: Cluster) -> None:
    cp1, cp2, cp3 = three.planes
    three.upstream.hold = asyncio.Event()
    cp1.mirror.fetch(SOURCE, FILES)
    await asyncio.wait_for(three.upstream.held.wait(), 10)  # cp1 has 1 MiB of 4
    assert (await three.store.get(CLAIMS + SOURCE)).value == b"cp1"  # type: ignore[union-attr]
    cp2.mirror.fetch(SOURCE, FILES)
    await asyncio.sleep(0.2)
    assert not cp2.holds()  # it waits for cp1 rather than fetch a second time
    assert three.upstream.requests["model.safetensors"] == 1

    await three.store.lease_revoke(cp1.lease)  # cp1 dies: its lease expires
    await cp1.mirror.close()
    await until(cp2.holds)
    assert three.upstream.requests["model.safetensors"] == 2  # cp2 took the fetch over
    assert not cp1.holds()
    cp3.mirror.fetch(SOURCE, FILES)  # copied from cp2, not fetched upstream again
    await until(cp3.holds)
    assert three.upstream.requests["model.safetensors"] == 2
    assert await holders(cp3, ["cp2", "cp3"]) == [(SOURCE, ["cp2", "cp3"], "")]


async def test_a_copy_goes_to_the_next_holder_when_one_lacks_the_file(three: Cluster) -> None:
    cp1, cp2, cp3 = three.planes
    cp1.mirror.fetch(SOURCE, FILES)
    await until(cp1.holds)
    cp2.mirror.fetch(SOURCE, FILES)
    await until(cp2.holds)
    cp1.mirror.store.remove(FILES[0].sha256)  # cp1 lost it (swept, a disk replaced)
    cp3.mirror.fetch(SOURCE, FILES)
    await until(cp3.holds)
    assert three.upstream.requests["model.safetensors"] == 1


async def _get(ctx: ssl.SSLContext, url: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(url, ssl=ctx) as r:
        return r.status


async def test_only_a_control_planes_certificate_is_let_in_as_one(three: Cluster) -> None:
    cp1 = three.planes[0]
    cp1.mirror.fetch(SOURCE, FILES)
    await until(cp1.holds)
    url = f"{cp1.url}{node_files.FILES}{FILES[1].sha256}"
    d = three.tmp
    pki.write_pair(pki.make_plane_cert(three.ca, "cp9"), d / "p.pem", d / "p.key")
    assert await _get(pki.client_context(three.ca.cert_pem, d / "p.pem", d / "p.key"), url) == 200
    key, csr = pki.make_node_csr("cp9")  # a node named like a control plane: a node still
    (d / "n.pem").write_bytes(pki.sign_csr(three.ca, csr, "cp9"))
    (d / "n.key").write_bytes(key)
    assert await _get(pki.client_context(three.ca.cert_pem, d / "n.pem", d / "n.key"), url) == 403
    assert await _get(pki.client_context(three.ca.cert_pem), url) == 403


async def test_a_control_plane_that_swept_a_set_no_longer_says_it_holds_it(
    three: Cluster,
) -> None:
    cp1, cp2, _ = three.planes
    for p in (cp1, cp2):
        p.mirror.fetch(SOURCE, FILES)
    await holders(cp1, ["cp1", "cp2"])
    fleet = cp1.mirror.fleet
    assert fleet is not None
    await fleet.swept({SOURCE})  # its model is still there: kept
    assert await holders(cp1, ["cp1", "cp2"])
    await fleet.swept(set())  # the model removed, its files swept here
    assert await holders(cp1, ["cp2"]) == [(SOURCE, ["cp2"], "")]
