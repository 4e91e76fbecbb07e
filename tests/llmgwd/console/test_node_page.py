"""The console's page of one node as a browser reads it: its cards (MIG instances inside them),
disks, replicas, Slurm standing and agent version; the node forms each role may send (those the rule
table lets it, no more); an unknown node is a 404 in the console's error page."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from llmgw import wire
from llmgw.api_types import SlurmNodeView
from llmgwd.api.routes import TABLE
from llmgwd.console.forms import NODE_FORMS
from llmgwd.console.headers import CSP
from llmgwd.people.records import STAFF_ROLES
from llmgwd.slurm.settings import SettingsStore
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.console.console_site import Browser, Forms, Site, csrf_of, serving
from tests.llmgwd.console.test_gpu_map import INVENTORIES, REPLICA, MapPage, recorded_nodes
from tests.llmgwd.console.test_overview_attention import FULL, NFT_REFUSED, disk_nodes

STANDING = SlurmNodeView(
    name="dgx", status="lent", held=True, state="allocated", jobs=["4711"], version="24.05.3"
)


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    store = await SqliteStore.open(":memory:")
    standing = SettingsStore(store), lambda: [STANDING]
    async with serving(slurm=standing[0], slurm_status=standing[1]) as s:
        s.nodes.items = recorded_nodes()
        yield s
    await store.close()


@pytest.fixture
async def browser(site: Site) -> AsyncIterator[Browser]:
    b = Browser(site)
    yield b
    await b.close()


async def _page(browser: Browser, name: str, role: str = "viewer") -> str:
    await browser.sign_in(role)
    r, html = await browser.get(f"/console/nodes/{name}")
    assert r.status == 200
    assert r.headers["Content-Security-Policy"] == CSP
    assert "<script>" not in html and " style=" not in html
    return html


async def test_its_cards_replicas_slurm_standing_and_agent(browser: Browser) -> None:
    html = await _page(browser, "dgx")
    page = MapPage(html)
    cards = INVENTORIES["dgx"].gpus
    assert set(page.places) == {g.uuid for g in cards}
    for g in cards:
        used = g.memory_total_bytes - g.memory_free_bytes
        assert page.places[g.uuid].meters["Memory"] == (str(used), str(g.memory_total_bytes))
    assert "<dt>Agent</dt><dd>0.9.1</dd>" in html
    row = f'<td>{REPLICA.id}</td><td><a href="/console/models">{REPLICA.model}</a></td>'
    assert row in html and '<span class="state-ready">ready</span>' in html
    assert f"<td>{REPLICA.port}</td>" in html
    assert "lent (held from llmgw" in html and "allocated" in html and "4711" in html
    assert "24.05.3" in html


async def test_a_mig_card_has_its_instances_inside_it(browser: Browser) -> None:
    page = MapPage(await _page(browser, "a100"))
    (card,) = INVENTORIES["a100"].gpus
    assert {u: p.parent for u, p in page.places.items()} == {
        card.uuid: None,
        **{m.uuid: card.uuid for m in card.instances},
    }


async def test_a_node_not_in_slurm_and_one_without_cards_say_so(browser: Browser) -> None:
    html = await _page(browser, "cpu-1")
    assert "Slurm is off." in html
    assert "No cards: it runs on its CPUs." in html and '<span class="bad">lost</span>' in html


DISK_ROW = re.compile(
    r'<tr class="disk"><th scope="row">(?P<path>[^<]*)</th>\s*'
    r'<td><meter min="0" max="(?P<size>\d+)" value="(?P<used>\d+)"[^>]*>[^<]*</meter>'
    r'(?P<words>[^<]*)(?P<full><span class="bad">full</span>)?</td>\s*'
    r'<td><data value="(?P<free>\d+)">[^<]*</data></td>\s*<td><data value="(?P<total>\d+)">'
)


def _disk(d: wire.Disk, words: str, full: bool) -> dict[str, str]:
    """A disk's row as the page should draw it: the inventory's figures, words and mark."""
    used = d.total_bytes - d.free_bytes
    return {
        "path": d.path, "size": str(d.total_bytes), "used": str(used), "words": words,
        "full": '<span class="bad">full</span>' if full else "", "free": str(d.free_bytes),
        "total": str(d.total_bytes),
    }  # fmt: skip


async def test_its_disks_as_its_agent_reported_them_a_full_one_marked(site: Site) -> None:
    site.nodes.items = disk_nodes()
    browser = Browser(site)
    try:
        html = await _page(browser, "full-1")
    finally:
        await browser.close()
    rows = [{**m.groupdict(""), "words": m["words"].strip()} for m in DISK_ROW.finditer(html)]
    cache, root = FULL  # 95 % and 60 % used
    assert rows == [_disk(cache, "95%, 950.0 GiB", True), _disk(root, "60%, 60.0 GiB", False)]


async def test_a_node_reporting_no_disks_says_so(site: Site) -> None:
    site.nodes.items = disk_nodes()
    browser = Browser(site)
    try:
        html = await _page(browser, "bare")
    finally:
        await browser.close()
    assert re.search(r'<h2 id="disks">Disks</h2>\s*<p>None reported.</p>', html)
    assert "<dt>Firewall</dt><dd>not reported</dd>" in html  # an agent older than the field


@pytest.mark.parametrize(("name", "shown"), [("full-1", NFT_REFUSED), ("roomy", "ok")])
async def test_its_firewall_as_its_agent_reported_it(site: Site, name: str, shown: str) -> None:
    site.nodes.items = disk_nodes()
    browser = Browser(site)
    try:
        html = await _page(browser, name)
    finally:
        await browser.close()
    assert f"<dt>Firewall</dt><dd>{shown}</dd>" in html


async def test_without_slurm_kept_here_the_page_says_so() -> None:
    async with serving() as site:
        site.nodes.items = recorded_nodes()
        b = Browser(site)
        try:
            html = await _page(b, "rtx")
        finally:
            await b.close()
    assert "Slurm is not kept by this control plane." in html


async def test_an_unknown_node_is_a_404_in_the_error_page(browser: Browser) -> None:
    await browser.sign_in("viewer")
    r, html = await browser.get("/console/nodes/ghost")
    assert r.status == 404
    assert r.headers["Content-Security-Policy"] == CSP
    assert '<p class="refusal" role="alert">no node named ghost</p>' in html


async def test_one_of_no_staff_role_is_refused_the_page(browser: Browser) -> None:
    await browser.sign_in("org-admin")  # GET /nodes's guard refuses them
    r, html = await browser.get("/console/nodes/dgx")
    assert r.status == 403 and not MapPage(html).places


def _allowed(role: str) -> set[tuple[str, str]]:
    """The node forms' routes the rule table lets a staff role send (with their action)."""
    out = set()
    for form in NODE_FORMS:
        route = next(r for r in TABLE if (r.method, r.path) == (form.method, form.path))
        if role in STAFF_ROLES and role in route.rule.staff:
            out.add((f"{route.method} {route.path}", form.fixed.get("action", "")))
    return out


@pytest.mark.parametrize("role", ["admin", "operator", "viewer"])
async def test_each_role_is_drawn_exactly_the_node_forms_the_rule_table_allows(
    browser: Browser, role: str
) -> None:
    html = await _page(browser, "rtx", role)
    sent = [f for f in Forms(html).forms if f["action"] == "/console/act"]
    assert {(f["route"], f.get("path.action", "")) for f in sent} == _allowed(role)
    assert all(f["path.name"] == "rtx" and f["csrf"] == csrf_of(html) for f in sent)
    assert bool(sent) == (role != "viewer")  # the table lets a viewer send none of them
    for f in sent:  # the node's page again after a change; the nodes page after a removal
        removal = f["route"].startswith("DELETE")
        assert f["back"] == ("/console/nodes" if removal else "/console/nodes/rtx")
