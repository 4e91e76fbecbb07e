"""The console's GPU map: every card of every node (a MIG card's instances inside it), coloured by
its work (SMs active where GPM reads them, else NVML's busy share), with its memory and power
against their limits; read from GET /api/v1/nodes (each node's last reported inventory). Its
live part, drawn once, is shared for SHARED_SECONDS by everyone who may read GET /nodes."""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import jinja2
from aiohttp import web
from markupsafe import Markup

from llmgw import wire
from llmgw.api_types import NodeView
from llmgwd.console import nav
from llmgwd.console.base import Person, console, render
from llmgwd.console.pages import live, read
from llmgwd.console.signin import required

T = TypeVar("T")
GIB = 1 << 30
# A work's band, the class its place is coloured by: its share in quarters, below 1 % idle.
_BANDS = ((1.0, "idle"), (25.0, "1"), (50.0, "2"), (75.0, "3"))
# How long one read and drawing of the live part serves every poll (htmx's: every 10 s).
SHARED_SECONDS = 2.0
clock: Callable[[], float] = time.monotonic
# The longest the drawing holds the event loop (/v1's too) before letting others run.
SLICE_SECONDS = 0.001


@dataclass(frozen=True, slots=True)
class Gauge:
    """A figure against its limit: for a <meter>, and in words."""

    value: float
    limit: float
    text: str


@dataclass(frozen=True, slots=True)
class Work:
    """How busy a place is: its band (a CSS class: work-idle, work-1..4, work-none) and words."""

    band: str
    text: str


@dataclass(frozen=True, slots=True)
class Place:
    """A card, or a MIG instance of one: what the map draws."""

    title: str
    uuid: str
    work: Work
    memory: Gauge
    power: Gauge | None = None
    instances: tuple[Place, ...] = ()
    mig: bool = False


@dataclass(frozen=True, slots=True)
class NodeCards:
    """A node's places on the map."""

    name: str
    connected: bool
    cards: tuple[Place, ...]


def band(percent: float) -> str:
    """The band of a share of work, in percent."""
    return next((name for top, name in _BANDS if percent < top), "4")


def work(counters: wire.GpuCounters | None, busy_percent: int | None) -> Work:
    """SMs active where GPM read them; else NVML's busy share; else not told."""
    sm = counters.sm_active_percent if counters is not None else None
    if sm is not None:
        return Work(band(sm), f"SMs active {sm:.0f}%")
    if busy_percent is not None:
        return Work(band(busy_percent), f"busy {busy_percent}%" if busy_percent else "idle")
    return Work("none", "busy share not told")


def memory(total: int, free: int) -> Gauge:
    """Memory used against the total, in GiB."""
    used = max(total - free, 0)
    return Gauge(used, total, f"{used / GIB:.1f} of {total / GIB:.1f} GiB used")


def power(draw_mw: int | None, limit_mw: int | None) -> Gauge | None:
    """Power drawn against its limit, in watts; None where NVML told neither."""
    if draw_mw is None:
        return None
    if not limit_mw:
        return Gauge(draw_mw, 0, f"{draw_mw / 1000:.0f} W (no limit told)")
    return Gauge(draw_mw, limit_mw, f"{draw_mw / 1000:.0f} of {limit_mw / 1000:.0f} W")


def instance(m: wire.MigInstance) -> Place:
    """A MIG instance: its own memory and counters (NVML tells no busy share or power)."""
    title = f"MIG {m.profile} (instance {m.gpu_instance_id}.{m.compute_instance_id})"
    return Place(
        title, m.uuid, work(m.counters, None), memory(m.memory_total_bytes, m.memory_free_bytes)
    )


def card(g: wire.Gpu) -> Place:
    """A card; in MIG mode its work is its instances', each drawn inside it."""
    parts = tuple(instance(m) for m in g.instances)
    told = work(g.counters, g.utilization_percent)
    if g.mig and told.band == "none":
        told = Work("none", f"MIG mode: {len(parts)} instances")
    return Place(
        f"GPU {g.index} · {g.name}",
        g.uuid,
        told,
        memory(g.memory_total_bytes, g.memory_free_bytes),
        power(g.power_draw_mw, g.power_limit_mw),
        parts,
        g.mig,
    )


def node_cards(n: NodeView) -> NodeCards:
    """A node's cards, by NVML's index."""
    cards = tuple(card(g) for g in sorted(n.cards, key=lambda g: g.index))
    return NodeCards(n.name, n.connected, cards)


def by_name(nodes: Sequence[NodeView]) -> Iterator[NodeCards]:
    """Every node's cards, nodes by name, one node at a time."""
    return (node_cards(n) for n in sorted(nodes, key=lambda n: n.name))


def gpu_map(nodes: Sequence[NodeView]) -> list[NodeCards]:
    """Every node's cards, nodes by name."""
    return list(by_name(nodes))


@dataclass(slots=True)
class Shared:
    """The live part last drawn (for one console), when its read began, and whether it is
    being drawn again now."""

    html: Markup = field(default_factory=Markup)
    at: float = -math.inf
    drawing: bool = False


_SHARED: weakref.WeakKeyDictionary[web.Application, Shared] = weakref.WeakKeyDictionary()


async def unhurried(items: Iterator[T]) -> list[T]:
    """items made in slices of SLICE_SECONDS, the event loop let go between them."""
    out: list[T] = []
    since = time.perf_counter()
    for item in items:
        out.append(item)
        if time.perf_counter() - since > SLICE_SECONDS:
            await asyncio.sleep(0)
            since = time.perf_counter()
    return out


async def drawn(template: jinja2.Template, **data: object) -> Markup:
    """template drawn in slices of SLICE_SECONDS, the event loop let go between them."""
    pieces = await unhurried(template.generate(**data))
    return Markup("".join(pieces))  # noqa: S704 (the autoescaping templates' own output)


async def live_part(request: web.Request, person: Person) -> Markup:
    """The map's live part: the one drawn under SHARED_SECONDS ago (or the last one, while
    another request draws it again), for a person who passes GET /nodes's rule now (its
    answer is the same for everyone it lets in); else drawn from this person's own read
    (whose guard refuses whom the rule does not pass)."""
    c = console(request)
    shared = _SHARED.setdefault(c.api, Shared())
    fresh = clock() - shared.at < SHARED_SECONDS or (shared.drawing and bool(shared.html))
    if fresh and await nav.may_read(request, person, "/nodes"):
        return shared.html
    began, shared.drawing = clock(), True
    try:
        nodes: list[NodeView] = await read(request, person, "/nodes")
        shown = await unhurried(by_name(nodes))
        cards = sum(len(n.cards) for n in shown)
        html = await drawn(c.templates.get_template("gpus_live.html"), nodes=shown, cards=cards)
    finally:
        shared.drawing = False
    shared.html, shared.at = html, began
    return html


async def gpus_page(request: web.Request) -> web.Response:
    """GET /console/gpus: the map; htmx polls its live part every 10 s."""
    person = required(request)
    part = await live_part(request, person)
    template = "live_part.html" if live(request) else "gpus.html"
    return render(request, template, person, live_part=part, page="gpus")
