"""The console's page of one node: its cards, disks, replicas, Slurm standing, firewall, agent
version and the node forms the person may send; read from GET /api/v1/nodes and /api/v1/slurm."""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiohttp import web

from llmgw.api_types import NodeView, SlurmNodeView, SlurmView
from llmgwd.console import forms
from llmgwd.console.base import BACK, ConsoleError, Person, console, render
from llmgwd.console.gpu_map import node_cards
from llmgwd.console.pages import FULL_DISK, read, read_kept, used_share
from llmgwd.console.signin import required
from llmgwd.people.directory import Directory

NODES = "/console/nodes"


@dataclass(frozen=True, slots=True)
class Slurm:
    """The node's standing between llmgw and Slurm, or why none is shown."""

    row: SlurmNodeView | None
    why: str = ""  # where row is None


async def slurm_of(request: web.Request, person: Person, name: str) -> Slurm:
    """GET /slurm's row for the node (a standby knows none; a plane keeping no Slurm, 503)."""
    view: SlurmView | None = await read_kept(request, person, "/slurm")
    if view is None:
        return Slurm(None, "Slurm is not kept by this control plane.")
    if view.status is None:
        return Slurm(None, "This control plane is a standby: the leader knows the standing.")
    row = next((s for s in view.status if s.name == name), None)
    if row is not None:
        return Slurm(row)
    if not view.enabled:
        return Slurm(None, "Slurm is off.")
    if name not in view.nodes:
        return Slurm(None, "Not one of Slurm's nodes.")
    return Slurm(None, "One of Slurm's nodes; no standing known yet.")


def back(form: forms.Form, name: str) -> str:
    """Where a form of the page returns to: the node's page, or the nodes page after a removal
    (or where the node's name is not one act sends back to)."""
    here = f"{NODES}/{name}"
    return here if not form.danger and BACK.fullmatch(here) else NODES


def seen(n: NodeView) -> str:
    """When the node was last heard from, in UTC."""
    if n.last_seen <= 0:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(n.last_seen))


async def node_page(request: web.Request) -> web.Response:
    """GET /console/nodes/{name}: one node; an unknown one is a 404 in the error page."""
    person = required(request)
    name = request.match_info["name"]
    nodes: list[NodeView] = await read(request, person, "/nodes")
    node = next((n for n in nodes if n.name == name), None)
    if node is None:
        raise ConsoleError(404, f"no node named {name}")
    c = console(request)
    roles = Directory(c.keys.store)
    drawn = await forms.drawn(person.who, c.routes, forms.NODE_FORMS, {"name": name}, roles)
    return render(
        request,
        "node.html",
        person,
        node=node,
        cards=node_cards(node),
        disks=[(d, used_share(d) > FULL_DISK) for d in node.disks],
        full_share=FULL_DISK,
        slurm=await slurm_of(request, person, name),
        drawn=[(d, back(d.form, name)) for d in drawn],
        seen=seen(node),
        page="nodes",
    )
