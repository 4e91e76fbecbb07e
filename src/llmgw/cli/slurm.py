"""llmgw slurm status|setup|lend|reclaim|off: Slurm on llmgw's nodes, and nodes lent to it."""

from __future__ import annotations

import click
import msgspec

from llmgw.api_types import SlurmSettingsIn, SlurmView
from llmgw.cli.common import API, Settings, api_path, call, decoded, pass_settings
from llmgw.cli.output import echo_json, echo_table, json_option


def _names(value: str) -> list[str]:
    return [n.strip() for n in value.split(",") if n.strip()]


def echo_slurm(answer: object) -> None:
    """Print the settings, then each node's standing."""
    view = decoded(answer, SlurmView)
    if not view.enabled:
        click.echo("Slurm is off.")
    else:
        click.echo(
            f"Slurm is on: cluster {view.cluster_name}, controller {view.controller},"
            f" partition {view.partition}"
        )
        click.echo(f"a new leader with no kept node list waits {view.hold_for_s} s for the nodes")
    named = ", ".join(view.nodes)
    if view.all_nodes:
        named = "every node of the cluster, those joining later too" + (f" ({named})" * bool(named))
    click.echo(f"nodes: {named or 'none'}")
    click.echo(f"lent:  {', '.join(view.lent) or 'none'}")
    if view.status is None:
        click.echo("(this control plane stands by: ask the leader for each node's standing)")
        return
    rows = [
        [s.name, s.status, s.state or "-", s.reason or "-", s.version or "-"] for s in view.status
    ]
    echo_table(["NODE", "STANDING", "SLURM STATE", "REASON", "VERSION"], rows, "No nodes yet.")
    for s in view.status:
        if s.message:
            click.echo(f"{s.name}: {s.message}")


@click.group()
def slurm() -> None:
    """Run Slurm on llmgw's nodes, and lend nodes to it or take them back."""


@slurm.command()
@json_option
@pass_settings
def status(settings: Settings, as_json: bool) -> None:
    """Show Slurm's settings and where each node stands.

    A node is lent (Slurm runs jobs there), lending (llmgw's replicas are moving away
    first), reclaiming (taken back: cordoned in llmgw until its last job ends and Slurm
    has it drained), or in llmgw. Slurm's state of it, the reason Slurm gives for a drain,
    Slurm's version and what failed last follow. Ask the leader: a standby knows no node's
    standing.
    """
    answer = call(settings, "GET", f"{API}/slurm")
    if as_json:
        echo_json(answer)
    else:
        echo_slurm(answer)


@slurm.command()
@click.option("--controller", required=True, metavar="NODE", help="The node slurmctld runs on.")
@click.option("--nodes", "node_names", metavar="A,B", help="The nodes slurmd runs on.")
@click.option(
    "--all-nodes",
    is_flag=True,
    help="slurmd on every node of the cluster, those that join later too (and --nodes).",
)
@click.option("--cluster-name", metavar="NAME", help="Slurm's ClusterName [default: llmgw].")
@click.option("--partition", metavar="NAME", help="The partition of the nodes [default: llmgw].")
@click.option(
    "--hold-for",
    "hold_for_s",
    type=click.IntRange(0, 3600),
    metavar="SECONDS",
    help="How long a new leader that finds no kept node list waits for the nodes to report"
    " before it writes slurm.conf without the silent ones [default: 120].",
)
@json_option
@pass_settings
def setup(
    settings: Settings,
    controller: str,
    node_names: str | None,
    all_nodes: bool,
    cluster_name: str | None,
    partition: str | None,
    hold_for_s: int | None,
    as_json: bool,
) -> None:
    """Turn Slurm on: slurmctld on the controller, slurmd on the nodes.

    Each node must have joined the cluster. The agents install munge and Slurm from the
    distribution and run them on the files the leader makes. Every node enters Slurm
    drained: `llmgw slurm lend NODE` gives it to Slurm. Give --nodes, --all-nodes or both.
    """
    if node_names is None and not all_nodes:
        raise click.UsageError("give the nodes slurmd runs on: --nodes A,B or --all-nodes")
    unset = msgspec.UNSET  # a field not given keeps its setting
    body = SlurmSettingsIn(
        enabled=True,
        controller=controller,
        nodes=_names(node_names or ""),
        all_nodes=all_nodes,
        cluster_name=unset if cluster_name is None else cluster_name,
        partition=unset if partition is None else partition,
        hold_for_s=unset if hold_for_s is None else hold_for_s,
    )
    _show(call(settings, "PUT", f"{API}/slurm", body), as_json)


@slurm.command()
@click.argument("node")
@json_option
@pass_settings
def lend(settings: Settings, node: str, as_json: bool) -> None:
    """Lend NODE to Slurm: llmgw's replicas there start elsewhere, then stop, and then
    Slurm gets the node (it is resumed there). `llmgw slurm status` shows the progress."""
    _show(call(settings, "POST", api_path("slurm", "nodes", node, "lend")), as_json)


@slurm.command()
@click.argument("node")
@json_option
@pass_settings
def reclaim(settings: Settings, node: str, as_json: bool) -> None:
    """Take NODE back from Slurm: it is drained there (no new job lands, running ones
    finish), and kept cordoned in llmgw until its last job ends; then llmgw places
    replicas there again. A drain a Slurm administrator made is never lifted."""
    _show(call(settings, "POST", api_path("slurm", "nodes", node, "reclaim")), as_json)


@slurm.command()
@json_option
@pass_settings
def off(settings: Settings, as_json: bool) -> None:
    """Turn Slurm off: the agents stop the Slurm they started (jobs running end with it),
    and every node is llmgw's.

    The settings (controller, nodes, lent ones) are kept for the next `llmgw slurm setup`.
    """
    _show(call(settings, "PUT", f"{API}/slurm", SlurmSettingsIn(enabled=False)), as_json)


def _show(answer: object, as_json: bool) -> None:
    if as_json:
        echo_json(answer)
    else:
        echo_slurm(answer)
