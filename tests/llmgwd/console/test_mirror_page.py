"""The console's mirror page as a browser reads it: every set GET /api/v1/mirror lists, with the
same sizes, its fetch progress and sha256 state; the peers; what a sweep would free (and then
frees); the mirror forms each role may send (those the rule table lets it, no more); a viewer's
forged sweep and a bad peer address refused in the console's error page."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import msgspec
import pytest

from llmgw.api_types import MirrorStatus, SweepOut
from llmgw.blobstore import ChecksumMismatch
from llmgw.wire import ModelFile
from llmgwd import auth
from llmgwd.api.routes import TABLE
from llmgwd.catalog import Model
from llmgwd.console.headers import CSP
from llmgwd.console.mirror_page import MIRROR_FORMS
from llmgwd.mirror.jobs import SetJob
from llmgwd.mirror.records import Peer, Records
from llmgwd.mirror.service import Mirror, Settings
from llmgwd.people.directory import Directory
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.console.console_site import Browser, Forms, Site, csrf_of, serving

COMMIT = {"done": "a" * 40, "fetching": "b" * 40, "bad": "c" * 40}
PEER = Peer(url="https://cp2:7700/hf", last_sync=1_700_000_000.0, last_error="peer said 503")


def _files(kind: str) -> list[ModelFile]:
    """A set's files: one fetched at once, and one per kind ("slow" never ends, "bad" fails)."""
    return [
        ModelFile(f"{kind}/config.json", 1000, "1" * 64),
        ModelFile(f"{kind}/model.gguf", 3_000_000, "2" * 64),
    ]


def _fake_run(wait: asyncio.Event) -> Callable[[SetJob, str | None], object]:
    """Mirror._run without an upstream: config.json arrives, the weights stop a third of the
    way (fetching), or fail their sha256 (bad)."""

    async def run(job: SetJob, plane: str | None = None) -> list[ModelFile]:
        async def one(f: ModelFile, progress: Callable[[int], None], _v: object) -> str:
            if f.path.endswith(".gguf") and job.repo == "org/fetching":
                progress(f.size // 3)
                await wait.wait()
            if f.path.endswith(".gguf") and job.repo == "org/bad":
                raise ChecksumMismatch(f"{f.path}: sha256 expected {f.sha256}, got {'0' * 64}")
            progress(f.size)
            return f.sha256

        return await job.run(one)

    return run


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    store = await SqliteStore.open(":memory:")
    records = Records(store)
    await records.load()
    await records.put_peer(PEER)
    mirror = Mirror(Settings(dir=tmp_path / "mirror", upstream="https://hub.example"), records)
    held = []
    for i, text in enumerate((b"used by a model", b"used by none, swept")):
        (tmp_path / f"f{i}").write_bytes(text)
        held.append(mirror.store.ingest(tmp_path / f"f{i}"))
    wait = asyncio.Event()
    mirror._run = _fake_run(wait)  # type: ignore[method-assign,assignment]
    async with serving(mirror=mirror) as s:
        kept = ModelFile("w.gguf", held[0].size, held[0].sha256)
        await s.catalog.add_model(Model(name="kept", source=f"hf:org/kept@{'d' * 40}",
                                        files=[kept]))  # fmt: skip
        for kind, commit in COMMIT.items():
            mirror.fetch(f"hf:org/{kind}@{commit}", _files(kind))
        for _ in range(20):  # the jobs run until they wait, fail or end
            await asyncio.sleep(0)
        yield s
        wait.set()
        await mirror.close()
    await store.close()


@pytest.fixture
async def browser(site: Site) -> AsyncIterator[Browser]:
    b = Browser(site)
    yield b
    await b.close()


async def _api(site: Site, method: str, path: str, body: object = None) -> bytes:
    """/api/v1 itself, with the admin key: what the page must agree with."""
    headers = {"Authorization": f"Bearer {site.keys['admin']}"}
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, f"{site.url}/api/v1{path}", json=body, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()
        return await r.read()


async def _page(browser: Browser, role: str = "viewer") -> str:
    await browser.sign_in(role)
    r, html = await browser.get("/console/mirror")
    assert r.status == 200
    assert r.headers["Content-Security-Policy"] == CSP
    assert "<script>" not in html and " style=" not in html
    return html


_ROW = re.compile(
    r'<tr data-set="([^"]+)">.*?<data class="size" value="(\d+)">.*?'
    r'<span class="sha[^"]*">([^<]+)</span>',
    re.DOTALL,
)


async def test_every_set_the_api_lists_with_its_size_progress_and_sha256_state(
    browser: Browser, site: Site
) -> None:
    status = msgspec.json.decode(await _api(site, "GET", "/mirror"), type=MirrorStatus)
    html = await _page(browser)
    rows = {name: (int(n), sha) for name, n, sha in _ROW.findall(html)}
    assert {name: n for name, (n, _) in rows.items()} == {
        f"{s.repo}@{s.commit}": s.bytes_total for s in status.sets
    }
    assert len(rows) == 3
    assert rows[f"org/done@{COMMIT['done']}"][1] == "checked"
    assert rows[f"org/fetching@{COMMIT['fetching']}"][1] == "not yet"
    assert rows[f"org/bad@{COMMIT['bad']}"][1] == "bad"
    assert '<progress value="1001000" max="3001000"' in html  # 1000 + a third of 3 MB
    assert "1 of 2 files checked" in html and "now: fetching/model.gguf" in html
    assert f'<data value="{status.bytes_held}">' in html and f"{status.files_held} files" in html
    assert PEER.url in html and "peer said 503" in html and "2023-11-14 22:13:20 UTC" in html


async def test_an_operator_sees_what_a_sweep_would_free_then_sweeps(
    browser: Browser, site: Site
) -> None:
    dry = await _api(site, "POST", "/mirror/sweep", {"dry_run": True})
    would = msgspec.json.decode(dry, type=SweepOut)
    assert would.files == 1
    html = await _page(browser, "operator")
    assert f'<data class="freed" value="{would.bytes}">' in html
    assert f"<strong>{would.files}</strong> on the mirror" in html and would.paths[0] in html
    (sweep,) = [f for f in Forms(html).forms if f.get("route") == "POST /mirror/sweep"]
    r, _ = await browser.post("/console/act", sweep)
    assert r.status == 303 and r.headers["Location"] == "/console/mirror"
    after = msgspec.json.decode(await _api(site, "GET", "/mirror"), type=MirrorStatus)
    assert after.files_held == 1  # the file a model uses stays
    _, html = await browser.get("/console/mirror")
    assert "<strong>0</strong> on the mirror" in html and "Done: POST /api/v1/mirror/sweep" in html


async def _allowed(site: Site, role: str) -> set[str]:
    """The mirror forms' routes the rule table lets this role's key send (auth.allowed over
    each Route record's rule, as /api/v1's guard decides)."""
    key = site.catalog.live_key(site.key_ids[role])
    assert key is not None
    who, roles = auth.of_key(key), Directory(site.catalog.store)
    out = set()
    for form in MIRROR_FORMS:
        route = next(r for r in TABLE if (r.method, r.path) == (form.method, form.path))
        if await auth.allowed(who, route.rule, {}, roles):
            out.add(f"{route.method} {route.path}")
    return out


@pytest.mark.parametrize("role", ["admin", "operator", "viewer", "org-admin"])
async def test_each_role_is_drawn_exactly_the_mirror_forms_the_rule_table_allows(
    browser: Browser, site: Site, role: str
) -> None:
    await browser.sign_in(role)
    r, html = await browser.get("/console/mirror")
    if role == "org-admin":  # no staff role: GET /mirror's guard refuses them the page
        assert r.status == 403 and "org/done" not in html
        return
    sent = [f for f in Forms(html).forms if f["action"] == "/console/act"]
    assert {f["route"] for f in sent} == await _allowed(site, role)
    assert all(f["csrf"] == csrf_of(html) and f["back"] == "/console/mirror" for f in sent)
    assert bool(sent) == (role != "viewer")  # the table lets a viewer send none
    assert ("what a sweep would free" in html) == (role == "viewer")  # no preview either


async def test_a_viewer_s_forged_sweep_gets_the_guard_s_403(browser: Browser, site: Site) -> None:
    html = await _page(browser, "viewer")
    form = {"csrf": csrf_of(html), "route": "POST /mirror/sweep", "back": "/console/mirror"}
    r, page = await browser.post("/console/act", form)
    assert r.status == 403 and "may not POST /api/v1/mirror/sweep" in page
    assert r.headers["Content-Security-Policy"] == CSP
    after = msgspec.json.decode(await _api(site, "GET", "/mirror"), type=MirrorStatus)
    assert after.files_held == 2


async def test_a_bad_peer_address_is_a_400_in_the_error_page(browser: Browser, site: Site) -> None:
    html = await _page(browser, "operator")
    (peer,) = [f for f in Forms(html).forms if f.get("route") == "POST /mirror/peers"]
    r, page = await browser.post("/console/act", peer | {"body.url": "ftp://cp3/hf"})
    assert r.status == 400 and '<p class="refusal" role="alert">' in page
    assert r.headers["Content-Security-Policy"] == CSP
    r, page = await browser.post("/console/act", peer | {"body.url": ""})  # none at all
    assert r.status == 400 and "url" in page
    _, html = await browser.get("/console/mirror")
    assert "ftp://cp3" not in html


async def test_htmx_polls_the_live_part_alone(browser: Browser, site: Site) -> None:
    html = await _page(browser)
    assert 'id="live" hx-get="/console/mirror" hx-trigger="every 5s"' in html
    headers = {"HX-Request": "true"}
    async with browser.session.get(site.url + "/console/mirror", headers=headers) as r:
        part = await r.text()
    assert r.status == 200 and part.startswith('<div id="live"') and "<html" not in part
    assert "org/fetching" in part and "/console/act" not in part
    assert r.headers["Content-Security-Policy"] == CSP and " style=" not in part


async def test_without_a_mirror_the_page_says_so() -> None:
    async with serving() as site:
        b = Browser(site)
        try:
            html = await _page(b, "admin")
        finally:
            await b.close()
    assert "This control plane keeps no mirror" in html and "/console/act" not in html


async def test_a_set_done_leads_to_the_serve_form_with_its_source(
    browser: Browser, site: Site
) -> None:
    html = await _page(browser, "operator")
    link = f"/console/serve?source=hf%3Aorg/done%40{COMMIT['done']}"
    assert f'href="{link}"' in html and html.count("Serve a model from it") == 1
    r, page = await browser.get(link)
    assert r.status == 200 and f'value="hf:org/done@{COMMIT["done"]}"' in page
