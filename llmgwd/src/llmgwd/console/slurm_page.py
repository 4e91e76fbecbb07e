"""The console's Slurm page: Slurm's settings, each of its nodes' standing between llmgw and Slurm,
and the lend and reclaim forms the person may send; read from GET /api/v1/slurm."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from llmgw.api_types import SlurmNodeView, SlurmView
from llmgwd.console import forms
from llmgwd.console.base import Person, console, render
from llmgwd.console.pages import live, read_kept
from llmgwd.console.signin import required
from llmgwd.people.directory import Directory

HERE = "/console/slurm"
POLL_S = 10  # the standings' poll: a node being lent or reclaimed moves on by itself

# Per node of Slurm's: lend it (its replicas move away first) or take it back.
_LEND = "/slurm/nodes/{name}/{action:lend|reclaim}"
SLURM_FORMS: tuple[forms.Form, ...] = tuple(
    forms.Form("POST", _LEND, a.title(), fixed={"action": a}) for a in ("lend", "reclaim")
)


@dataclass(frozen=True, slots=True)
class Row:
    """One node of Slurm's: its standing (None: none known yet) and the forms drawn for it."""

    name: str
    standing: SlurmNodeView | None
    lent: bool  # in the settings' lent list
    drawn: list[forms.Drawn]


async def _view(request: web.Request, person: Person) -> SlurmView | None:
    """GET /slurm as the person, or None where this llmgwd keeps no Slurm (its 503)."""
    view: SlurmView | None = await read_kept(request, person, "/slurm")
    return view


async def rows(request: web.Request, person: Person, view: SlurmView) -> list[Row]:
    """Slurm's nodes (and any the standing names beside them), each with its forms."""
    c = console(request)
    roles = Directory(c.keys.store)
    known = {s.name: s for s in view.status or []}
    out = []
    for name in sorted({*view.nodes, *known}):
        drawn = await forms.drawn(person.who, c.routes, SLURM_FORMS, {"name": name}, roles)
        out.append(Row(name, known.get(name), name in view.lent, drawn))
    return out


async def slurm_page(request: web.Request) -> web.Response:
    """GET /console/slurm: the settings and the nodes' standing (htmx polls them alone every
    POLL_S s), with lend and reclaim where the person may send them."""
    person = required(request)
    view = await _view(request, person)
    nodes = await rows(request, person, view) if view is not None else []
    return render(
        request,
        "slurm_live.html" if live(request) else "slurm.html",
        person,
        view=view,
        nodes=nodes,
        back=HERE,
        poll=POLL_S,
        page="slurm",
    )
