"""llmgw node token|join|remove and llmgw nodes: nodes joining and leaving the cluster, listed."""

from __future__ import annotations

from typing import Any

import click

from llmgw.api_types import NodeRemoved, NodeView, TokenView
from llmgw.cli import complete, wait
from llmgw.cli.common import API, Settings, api_path, call, decoded, pass_settings
from llmgw.cli.output import (
    Listing,
    ago,
    confirm,
    echo_json,
    json_option,
    listing_options,
    size,
    yes_option,
)


def echo_join_command(answer: Any) -> None:
    """Print the command a node joins with and how long it works (a TokenView's fields)."""
    token = decoded(answer, TokenView)
    minutes = token.expires_in // 60
    click.echo("Join a node to this cluster by running, on the node:")
    click.echo(f"  {token.command}")
    click.echo(f"The token works once, for {minutes} minutes.")


@click.group()
def node() -> None:
    """Join nodes to the cluster, remove them, and cordon, drain or uncordon them."""


@node.command()
@json_option
@pass_settings
def token(settings: Settings, as_json: bool) -> None:
    """Make a new join token and print the command that joins a node with it.

    A token is good for one node and expires after the server's join_token_ttl_s.
    """
    answer = call(settings, "POST", f"{API}/tokens")
    if as_json:
        echo_json(answer)
    else:
        echo_join_command(answer)


@node.command()
@click.argument("url")
@click.option(
    "--token",
    "join_token",
    required=True,
    envvar="LLMGW_JOIN_TOKEN",
    help="The join token from `llmgw node token` (or env LLMGW_JOIN_TOKEN).",
)
@json_option
@pass_settings
def join(settings: Settings, url: str, join_token: str, as_json: bool) -> None:
    """Join this node to the cluster whose control plane is at URL.

    Run on the node, where llmgw-agentd runs: the agent asks URL (https://HOST:7710) for
    its certificate with the token, then keeps a connection to the control plane.
    """
    if not url.startswith("https://"):
        raise click.BadParameter("must be https://HOST:PORT (the cluster port)", param_hint="URL")
    answer = call(settings, "POST", f"{API}/join", {"url": url, "token": join_token}, agent=True)
    if as_json:
        echo_json(answer)
        return
    name = answer.get("node") if isinstance(answer, dict) else None
    verb = "Already joined" if isinstance(answer, dict) and answer.get("already") else "Joined"
    click.echo(f"{verb} the cluster at {url}" + (f" as node {name}." if name else "."))


def _flag(action: str, settings: Settings, name: str, as_json: bool) -> None:
    answer = call(settings, "POST", api_path("nodes", name, action))
    if as_json:
        echo_json(answer)
        return
    said = {"cordon": "cordoned: it takes no new replicas",
            "drain": "draining: its replicas are placed elsewhere, then stopped here",
            "uncordon": "uncordoned: it takes new replicas again"}  # fmt: skip
    click.echo(f"Node {name} {said[action]}.")


@node.command()
@click.argument("name", shell_complete=complete.nodes)
@json_option
@pass_settings
def cordon(settings: Settings, name: str, as_json: bool) -> None:
    """Place no new replicas on node NAME; those there keep running."""
    _flag("cordon", settings, name, as_json)


@node.command()
@click.argument("name", shell_complete=complete.nodes)
@wait.wait_options
@json_option
@pass_settings
def drain(
    settings: Settings, name: str, wait_done: bool, wait_timeout: float, as_json: bool
) -> None:
    """Move the replicas of node NAME elsewhere: each stops once its replacement is ready.
    With --wait, until the node holds none."""
    _flag("drain", settings, name, as_json)
    if wait_done:
        wait.wait_drained(settings, name, wait_timeout)


@node.command()
@click.argument("name", shell_complete=complete.nodes)
@json_option
@pass_settings
def uncordon(settings: Settings, name: str, as_json: bool) -> None:
    """Let node NAME take new replicas again (after cordon or drain)."""
    _flag("uncordon", settings, name, as_json)


@node.command()
@click.argument("name", shell_complete=complete.nodes)
@yes_option
@json_option
@pass_settings
def remove(settings: Settings, name: str, yes: bool, as_json: bool) -> None:
    """Remove node NAME from the cluster: its certificates are refused from now on.

    Its connection is closed and its replicas are placed on other nodes at once. It comes
    back only by joining again with a new token (`llmgw node token`), under this name or
    another. Run it for a node that is gone for good, or whose certificate may be in other
    hands; `llmgw node drain` moves replicas off a node that stays. It asks first, unless
    --yes.
    """
    confirm(yes, f"Removing node {name} revokes its certificates and moves its replicas away")
    answer = call(settings, "DELETE", api_path("nodes", name))
    if as_json:
        echo_json(answer)
    elif decoded(answer, NodeRemoved).known:
        click.echo(f"Node {name} removed: its certificates are refused from now on.")
    else:
        click.echo(
            f"No node {name} is known here; its name is revoked all the same: "
            "a certificate of it is refused from now on."
        )


def _state(n: NodeView) -> str:
    state = "connected" if n.connected else "disconnected"
    if n.draining:
        return f"{state}, draining"
    return f"{state}, cordoned" if n.cordoned else state


def _replicas(n: NodeView) -> str:
    return f"{sum(r.state == 'ready' for r in n.replicas)}/{len(n.replicas)}"


def _engines(n: NodeView) -> str:
    """Its engines ("llama.cpp:cpu,gpu vllm:gpu"), with the CUDA toolkit's version if any."""
    kinds: dict[str, list[str]] = {}
    for item in n.engines:
        engine, _, kind = item.partition(":")
        kinds.setdefault(engine, []).append(kind)
    said = " ".join(f"{e}:{','.join(k)}" for e, k in kinds.items()) or "llama.cpp:cpu"
    return f"{said} (CUDA {n.cuda_toolkit})" if n.cuda_toolkit else said


@click.command()
@listing_options
@pass_settings
def nodes(settings: Settings, out: Listing) -> None:
    """List the nodes, their resources and replicas.

    One line a node: address, whether it is connected (and cordoned or draining), when it
    was last heard from, its cores, memory and cards, the engines it runs on CPUs and cards
    (with its CUDA toolkit's version), and its replicas (ready of all). A note follows for a
    node that needs one, such as cards without the CUDA toolkit (llama.cpp on CPUs only), or
    one whose firewall (its nftables table) could not be set (on stderr with --no-headers).
    -o wide adds its agent's version and its firewall's state.
    """
    answer = call(settings, "GET", f"{API}/nodes")
    if out.raw(answer):
        return
    found = decoded(answer, list[NodeView])
    rows = [
        [
            n.name,
            n.address,
            _state(n),
            ago(n.last_seen),
            n.cores,
            size(n.memory_bytes),
            n.gpus,
            _engines(n),
            _replicas(n),
            n.version or "-",
            n.firewall or "-",
        ]
        for n in found
    ]
    headers = ["NAME", "ADDRESS", "STATE", "LAST SEEN", "CORES", "MEMORY", "GPUS", "ENGINES"]
    headers += ["REPLICAS", "VERSION", "FIREWALL"]
    empty = "No nodes yet: join one with the command `llmgw node token` prints."
    out.table(headers, rows, empty, shown=9)
    for n in found:  # notes on stderr without headers: stdout is the table's rows alone
        if n.note:
            click.echo(f"{n.name}: {n.note}", err=not out.headers)
        if n.firewall not in ("", "ok", "off"):  # its engine ports may be open
            click.echo(f"{n.name}: its firewall is not set: {n.firewall}", err=not out.headers)
