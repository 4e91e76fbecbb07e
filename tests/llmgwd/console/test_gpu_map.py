"""The console's GPU map as a browser reads it, over nodes whose inventories are recorded NVML
answers (an 8-card H100 box with GPM, an RTX 4090 box, an A100 and an H100 in MIG mode): every
card of every node with its memory and power as the inventory has them, MIG instances inside
their card, each coloured by its work, each leading to its node's page."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from html.parser import HTMLParser

import msgspec
import pytest

from llmgw import wire
from llmgwd.api.base import ClusterNodes, NodeInfo
from llmgwd.console import gpu_map
from llmgwd.console.base import templates
from llmgwd.console.headers import CSP
from llmgwd.nodes import state
from tests.llmgw_agentd.nvml_inventory import hopper_mig, load, recorded
from tests.llmgwd.console.console_site import Browser, Site, serving

REPLICA = wire.ReplicaStatus("smol-0", "smol", "ready", port=41001, restarts=2)


def _record(name: str, inv: wire.Inventory, connected: bool = True) -> state.NodeInfo:
    replicas = (REPLICA,) if name == "dgx" else ()
    return state.NodeInfo(
        name=name, address=f"10.0.0.{len(name)}", version="0.9.1", inventory=inv,
        replicas=replicas, desired=None, connected=connected, last_seen=1_760_000_000.0,
    )  # fmt: skip


def busy_rtx() -> wire.Inventory:
    """The RTX 4090 box with its first card busy 37 % of the time and its second 80 %."""
    inv = recorded(load("rtx4090-8x24gb"))
    cards = list(inv.gpus)
    cards[0] = msgspec.structs.replace(cards[0], utilization_percent=37)
    cards[1] = msgspec.structs.replace(cards[1], utilization_percent=80)
    return msgspec.structs.replace(inv, gpus=cards)


def _other(uuid: str) -> str:
    return uuid[:-1] + ("1" if uuid.endswith("0") else "0")


def hopper() -> wire.Inventory:
    """The H100 in MIG mode (made of the A100's recording): its UUIDs made its own."""
    inv = recorded(hopper_mig())
    cards = [
        msgspec.structs.replace(
            g,
            uuid=_other(g.uuid),
            instances=[msgspec.structs.replace(m, uuid=_other(m.uuid)) for m in g.instances],
        )
        for g in inv.gpus
    ]
    return msgspec.structs.replace(inv, gpus=cards)


INVENTORIES: dict[str, wire.Inventory] = {
    "dgx": recorded(load("dgx-h100-8x80gb")),
    "rtx": busy_rtx(),
    "a100": recorded(load("a100-80gb-mig")),
    "hopper": hopper(),
    "cpu-1": wire.Inventory(cores=16, memory_bytes=64 << 30, memory_free_bytes=32 << 30),
}


def recorded_nodes() -> list[NodeInfo]:
    """The nodes as GET /api/v1/nodes shows them (ClusterNodes over the cluster state's
    records); cpu-1 lost."""
    records = [_record(n, inv, n != "cpu-1") for n, inv in INVENTORIES.items()]
    return ClusterNodes(lambda: records).nodes()


@dataclass
class Drawn:
    """A place of the map as drawn: its class, words, meters, link and the card it is in."""

    uuid: str
    classes: set[str]
    parent: str | None
    meters: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (value, max)
    href: str = ""
    text: str = ""


class MapPage(HTMLParser):
    """The places of a page (li elements with data-uuid), nested as drawn."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.places: dict[str, Drawn] = {}
        self._stack: list[str | None] = []  # the li elements open, their uuid or None
        self.feed(html)

    def _inner(self) -> Drawn | None:
        uuid = next((u for u in reversed(self._stack) if u), None)
        return self.places[uuid] if uuid else None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        inner = self._inner()
        if tag == "li":
            uuid = a.get("data-uuid") or None
            if uuid:
                parent = inner.uuid if inner else None
                self.places[uuid] = Drawn(uuid, set(a.get("class", "").split()), parent)
            self._stack.append(uuid)
        elif tag == "meter" and inner is not None:
            inner.meters[a["aria-label"].split(":")[0]] = (a["value"], a["max"])
        elif tag == "a" and inner is not None and not inner.href:
            inner.href = a["href"]

    def handle_endtag(self, tag: str) -> None:
        if tag == "li" and self._stack:
            self._stack.pop()

    def handle_data(self, data: str) -> None:
        inner = self._inner()
        if inner is not None:
            inner.text += data


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    async with serving() as s:
        s.nodes.items = recorded_nodes()
        yield s


@pytest.fixture
async def browser(site: Site) -> AsyncIterator[Browser]:
    b = Browser(site)
    yield b
    await b.close()


async def _map(browser: Browser, role: str = "viewer") -> MapPage:
    await browser.sign_in(role)
    r, html = await browser.get("/console/gpus")
    assert r.status == 200
    assert r.headers["Content-Security-Policy"] == CSP
    assert "<script>" not in html and " style=" not in html  # the policy allows neither
    return MapPage(html)


async def test_every_card_of_every_node_with_the_inventorys_memory_and_power(
    browser: Browser,
) -> None:
    page = await _map(browser)
    cards = [(n, g) for n, inv in INVENTORIES.items() for g in inv.gpus]
    assert len(cards) == 8 + 8 + 1 + 1
    for node, g in cards:
        p = page.places[g.uuid]
        assert p.parent is None, g.uuid
        used = g.memory_total_bytes - g.memory_free_bytes
        assert p.meters["Memory"] == (str(used), str(g.memory_total_bytes)), g.uuid
        assert g.power_draw_mw is not None and g.power_limit_mw
        assert p.meters["Power"] == (str(g.power_draw_mw), str(g.power_limit_mw)), g.uuid
        assert p.href == f"/console/nodes/{node}", g.uuid
        assert f"GPU {g.index} · {g.name}" in p.text
    mig = [m for _, g in cards for m in g.instances]
    assert len(page.places) == len(cards) + len(mig)


async def test_mig_instances_are_drawn_inside_their_card_with_their_own_memory(
    browser: Browser,
) -> None:
    page = await _map(browser)
    for node in ("a100", "hopper"):
        (card,) = INVENTORIES[node].gpus
        assert card.mig and len(card.instances) == 4
        assert "MIG mode: 4 instances" in page.places[card.uuid].text
        for m in card.instances:
            p = page.places[m.uuid]
            assert p.parent == card.uuid
            used = m.memory_total_bytes - m.memory_free_bytes
            assert p.meters == {"Memory": (str(used), str(m.memory_total_bytes))}
            assert f"MIG {m.profile}" in p.text


async def test_each_place_is_coloured_by_sms_active_else_by_its_busy_share(
    browser: Browser,
) -> None:
    page = await _map(browser)
    dgx = INVENTORIES["dgx"].gpus
    # The two H100s whose GPM counters were recorded: 91 % and 93 % of their SMs active.
    for g, words in ((dgx[0], "SMs active 91%"), (dgx[1], "SMs active 93%")):
        assert "work-4" in page.places[g.uuid].classes and words in page.places[g.uuid].text
    # The other H100s: no counters, NVML's busy share 0.
    assert "work-idle" in page.places[dgx[2].uuid].classes
    assert "idle" in page.places[dgx[2].uuid].text
    rtx = INVENTORIES["rtx"].gpus
    assert "work-2" in page.places[rtx[0].uuid].classes  # busy 37 %: the second quarter
    assert "busy 37%" in page.places[rtx[0].uuid].text
    assert "work-4" in page.places[rtx[1].uuid].classes  # busy 80 %
    # The Hopper's MIG instances have counters of their own; the A100's, before GPM, none,
    # and NVML tells no busy share of an instance.
    for m in INVENTORIES["hopper"].gpus[0].instances:
        assert "work-4" in page.places[m.uuid].classes
    for m in INVENTORIES["a100"].gpus[0].instances:
        assert "work-none" in page.places[m.uuid].classes
        assert "busy share not told" in page.places[m.uuid].text


async def test_a_node_without_cards_and_a_lost_node_are_said_so(browser: Browser) -> None:
    await browser.sign_in("operator")
    _, html = await browser.get("/console/gpus")
    assert "18 cards on 5 nodes" in html
    assert '<a href="/console/nodes/cpu-1">cpu-1</a> <span class="bad">lost' in html
    assert "No cards: it runs on its CPUs." in html


async def test_the_live_part_alone_answers_htmxs_poll(browser: Browser) -> None:
    await browser.sign_in("viewer")
    async with browser.session.get(
        browser.site.url + "/console/gpus", headers={"HX-Request": "true"}
    ) as r:
        html = await r.text()
    assert r.status == 200
    assert html.lstrip().startswith('<div id="live"') and "<html" not in html
    assert len(MapPage(html).places) == 18 + 8


async def test_no_one_signed_out_nor_of_no_staff_role_sees_the_map(browser: Browser) -> None:
    r, _ = await browser.get("/console/gpus")
    assert (r.status, r.headers["Location"]) == (303, "/console/login")
    await browser.sign_in("org-admin")  # no staff role: GET /nodes's guard refuses
    r, html = await browser.get("/console/gpus")
    assert r.status == 403 and r.headers["Content-Security-Policy"] == CSP
    assert not MapPage(html).places


async def _live(browser: Browser) -> tuple[int, str]:
    async with browser.session.get(
        browser.site.url + "/console/gpus", headers={"HX-Request": "true"}
    ) as r:
        return r.status, await r.text()


async def test_one_drawing_is_shared_but_each_persons_rule_is_asked_each_time(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(gpu_map, "clock", lambda: now[0])
    viewer, admin, other = Browser(site), Browser(site), Browser(site)
    try:
        await viewer.sign_in("viewer")
        await admin.sign_in("admin")
        await other.sign_in("org-admin")
        seen = [await _live(viewer), await _live(admin)]
        assert seen[0] == seen[1] and seen[0][0] == 200
        assert len(MapPage(seen[0][1]).places) == 18 + 8
        # A fresh drawing exists; one GET /nodes refuses is refused it all the same.
        status, html = await _live(other)
        assert status == 403 and not MapPage(html).places
        # So is the viewer, once their staff role is taken away.
        (vic,) = [u for u in await site.people.users() if u.name == "vic"]
        await site.people.set_staff(vic.id, None)
        assert (await _live(viewer))[0] == 403
    finally:
        for b in (viewer, admin, other):
            await b.close()


async def test_the_map_shows_a_changed_inventory_once_the_sharing_window_is_over(
    site: Site, browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(gpu_map, "clock", lambda: now[0])
    await browser.sign_in("viewer")
    card = INVENTORIES["rtx"].gpus[2]
    assert "work-idle" in MapPage((await _live(browser))[1]).places[card.uuid].classes
    busy = msgspec.structs.replace(card, utilization_percent=90)
    gpus = [busy if g.uuid == card.uuid else g for g in INVENTORIES["rtx"].gpus]
    changed = dict(INVENTORIES, rtx=msgspec.structs.replace(INVENTORIES["rtx"], gpus=gpus))
    site.nodes.items = ClusterNodes(
        lambda: [_record(n, inv, n != "cpu-1") for n, inv in changed.items()]
    ).nodes()
    now[0] += gpu_map.SHARED_SECONDS - 0.1  # within the window: the drawing shared
    assert "work-idle" in MapPage((await _live(browser))[1]).places[card.uuid].classes
    now[0] += 0.2  # past it: drawn again from the changed inventory
    drawn = MapPage((await _live(browser))[1]).places[card.uuid]
    assert "work-4" in drawn.classes and "busy 90%" in drawn.text


async def test_drawing_the_map_lets_other_requests_run_between_its_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpu_map, "SLICE_SECONDS", -1.0)  # let go after every piece
    template = templates().get_template("gpus_live.html")
    shown = gpu_map.gpu_map(recorded_nodes())
    ticks = 0

    async def other() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    running = asyncio.create_task(other())
    await asyncio.sleep(0)
    try:
        html = await gpu_map.drawn(template, nodes=shown, cards=18)
    finally:
        running.cancel()
    assert html == template.render(nodes=shown, cards=18)
    assert ticks > len(shown) * 2  # it ran between the nodes' cards, not only before and after
