"""The console's pages: the overview and the models, each read through the /api/v1 GET routes
(their guards, handlers and answer types) and drawing only the forms the person may send."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from llmgw import wire
from llmgw.api_types import ModelView, NodeView, ProviderView
from llmgwd.api.access import private_path
from llmgwd.console import forms, inproc, nav
from llmgwd.console.base import PREFIX, ConsoleError, Person, console, render, see_other
from llmgwd.console.signin import required
from llmgwd.people.directory import Directory

# GET /planes (GET /servers before it was renamed): whichever the route table has.
PLANES = ("/planes", "/servers")


async def read(
    request: web.Request, person: Person, plain: str, params: Mapping[str, str] | None = None
) -> Any:
    """What GET plain answers this person, as its answer type; its refusal is the page's."""
    c = console(request)
    route = c.routes.get("GET", plain)
    if route is None:
        raise ConsoleError(500, f"/api/v1 has no GET {plain}")
    answer = await inproc.call(request, c.api, person.who, route, params or {})
    if not answer.ok:
        raise ConsoleError(answer.status, answer.message())
    return inproc.decoded(answer, route)


async def read_kept(
    request: web.Request, person: Person, plain: str, params: Mapping[str, str] | None = None
) -> Any | None:
    """read's answer, or None where this llmgwd keeps no such thing (the route's 503: no etcd,
    no mirror, no Slurm)."""
    try:
        return await read(request, person, plain, params)
    except ConsoleError as e:
        if e.status == 503:
            return None
        raise


async def _planes(request: web.Request, person: Person) -> list[Any]:
    """The control planes (none where this llmgwd keeps none: one with no etcd)."""
    plain = next((p for p in PLANES if console(request).routes.get("GET", p)), PLANES[0])
    return list(await read_kept(request, person, plain) or [])


@dataclass(frozen=True, slots=True)
class Attention:
    """One thing that needs a person: what, and where."""

    what: str
    where: str


# A disk needs attention above this share of it used (total less what the agent may still
# write): a share, not a floor in bytes, since one floor would be needlessly loud on a 20 GiB
# root or too late on a 10 TiB disk, while 10 % left is little on either.
FULL_DISK = 0.9


def used_share(d: wire.Disk) -> float:
    """The share of the disk used (0 for one that reports no size)."""
    return (d.total_bytes - d.free_bytes) / d.total_bytes if d.total_bytes > 0 else 0.0


def full_disks(n: NodeView) -> list[Attention]:
    """The node's disks used over FULL_DISK, as its agent last reported them."""
    return [
        Attention(
            f"disk {d.path} {used_share(d):.0%} full, {d.free_bytes / 2**30:.1f} GiB free"
            f" of {d.total_bytes / 2**30:.1f} GiB",
            n.name,
        )
        for d in n.disks
        if used_share(d) > FULL_DISK
    ]


def attention(nodes: Sequence[NodeView], models: Sequence[ModelView]) -> list[Attention]:
    """Nodes lost, disks full, and replicas failing (or killed over their memory)."""
    out = [Attention("node lost: not connected", n.name) for n in nodes if not n.connected]
    out += [a for n in nodes for a in full_disks(n)]
    for m in models:
        for r in m.replica_status:
            if r.state == "failed" or r.reason == "oom":
                why = r.message or r.reason or r.state
                out.append(Attention(f"replica {r.id} of {m.name}: {why}", r.node))
    return out


def live(request: web.Request) -> bool:
    """Whether htmx asks (its poll of a page's live part): the part alone is answered."""
    return request.headers.get("HX-Request") == "true"


async def overview(request: web.Request) -> web.Response:
    """GET /console/: nodes, models, control planes, and what needs attention; htmx polls
    its live part every 5 s. One who may not read /status (an organization's admin with no
    staff role) is sent to their organization's page instead."""
    person = required(request)
    if not await nav.may_read(request, person, "/status"):
        return see_other(PREFIX + "/org")
    status = await read(request, person, "/status")
    nodes: list[NodeView] = await read(request, person, "/nodes")
    models: list[ModelView] = await read(request, person, "/models")
    planes = await _planes(request, person)
    return render(
        request,
        "overview_live.html" if live(request) else "overview.html",
        person,
        status=status,
        nodes=nodes,
        models=models,
        planes=planes,
        attention=attention(nodes, models),
        page="overview",
    )


async def model_forms(
    request: web.Request, person: Person, models: Sequence[ModelView]
) -> dict[str, list[forms.Drawn]]:
    """Per model, the forms of its card this person may send."""
    c = console(request)
    roles = Directory(c.keys.store)
    out = {}
    for m in models:
        values = forms.model_values(
            m.replicas, m.context, m.price_prompt, m.price_completion, m.max_tokens
        )
        out[m.name] = await forms.drawn(
            person.who, c.routes, forms.MODEL_FORMS, {"name": m.name}, roles, values
        )
    return out


async def models_page(request: web.Request) -> web.Response:
    """GET /console/models: the catalog, and the forms a person may send for each model."""
    person = required(request)
    models: list[ModelView] = await read(request, person, "/models")
    drawn = await model_forms(request, person, models)
    c = console(request)
    roles = Directory(c.keys.store)
    adds = await forms.drawn(person.who, c.routes, (forms.ADD_FORM,), {}, roles)
    providers: list[ProviderView] = await read(request, person, "/providers")
    add_provider = await forms.drawn(person.who, c.routes, (forms.PROVIDER_ADD_FORM,), {}, roles)
    removes = {
        p.name: await forms.drawn(
            person.who, c.routes, (forms.PROVIDER_REMOVE_FORM,), {"name": p.name}, roles
        )
        for p in providers
    }
    return render(
        request, "models.html", person, models=models, drawn=drawn, may_add=bool(adds),
        providers=providers, add_provider=add_provider, removes=removes,
        private=private_path(request), page="models",
    )  # fmt: skip


async def nodes_page(request: web.Request) -> web.Response:
    """GET /console/nodes: every node (cards, engines, firewall, agent version, replicas), and
    the forms a person may send for each."""
    person = required(request)
    nodes: list[NodeView] = await read(request, person, "/nodes")
    c = console(request)
    roles = Directory(c.keys.store)
    drawn = {
        n.name: await forms.drawn(person.who, c.routes, forms.NODE_FORMS, {"name": n.name}, roles)
        for n in nodes
    }
    return render(request, "nodes.html", person, nodes=nodes, drawn=drawn, page="nodes")
