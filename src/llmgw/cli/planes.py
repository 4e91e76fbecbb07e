"""llmgw plane token|leave|remove and llmgw planes: the control planes, grown and shrunk."""

from __future__ import annotations

import subprocess

import click

from llmgw.api_types import PlaneRemoved, PlaneTokenIn, PlaneView, RemoveIn, TokenView
from llmgw.cli.common import (
    API,
    Refused,
    Settings,
    api_path,
    call,
    decoded,
    local,
    pass_settings,
)
from llmgw.cli.output import Listing, echo_json, json_option, listing_options

UNITS = ("llmgwd.service", "llmgw-etcd.service")


@click.command("token")
@click.option(
    "--ttl",
    "ttl_s",
    type=click.IntRange(60, 3600),
    default=900,
    show_default=True,
    help="Seconds the token works for.",
)
@json_option
@pass_settings
def token(settings: Settings, ttl_s: int, as_json: bool) -> None:
    """Make a one-time token for a new control plane and print the command it joins with.

    Run on a control plane of a cluster whose store is etcd (`llmgw plane migrate --to
    etcd` first on a one-machine SQLite cluster). The token is not a node token, nor the
    reverse: `llmgw node join` refuses it.
    """
    answer = call(settings, "POST", f"{API}/planes/tokens", PlaneTokenIn(ttl_s=ttl_s))
    if as_json:
        echo_json(answer)
        return
    click.echo("Add a control plane to this cluster by running, on the new host:")
    made = decoded(answer, TokenView)
    click.echo(f"  {made.command}")
    click.echo(f"The token works once, for {made.expires_in // 60} minutes.")


def _stop_units() -> None:
    """systemctl disable --now llmgwd and llmgw-etcd; a failure is said, not hidden."""
    res = subprocess.run(
        ["systemctl", "disable", "--now", *UNITS], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise Refused(f"systemctl disable --now failed: {res.stderr.strip()}")


@click.command("leave")
@click.option("--force", is_flag=True, help="Leave even if the members left lose their quorum.")
@click.option("--keep-running", is_flag=True, help="Leave llmgwd and llmgw-etcd running.")
@json_option
@pass_settings
def leave(settings: Settings, force: bool, keep_running: bool, as_json: bool) -> None:
    """Take this control plane out of the cluster: its etcd member is removed, then llmgwd
    and llmgw-etcd are stopped and disabled here.

    Refused for the last member, and (without --force) when the members left would not
    have a quorum of healthy members.
    """
    answer = call(local(settings), "POST", f"{API}/planes/leave", RemoveIn(force=force))
    if not keep_running:
        _stop_units()
    if as_json:
        echo_json(answer)
    else:
        gone = decoded(answer, PlaneRemoved)
        click.echo(f"Control plane {gone.name} left the cluster; its units are stopped.")


@click.command("remove")
@click.argument("name")
@click.option("--force", is_flag=True, help="Remove it even if it is healthy or quorum is lost.")
@json_option
@pass_settings
def remove(settings: Settings, name: str, force: bool, as_json: bool) -> None:
    """Remove control plane NAME (a dead host) from the store's etcd cluster.

    Refused for the last member, for this control plane (`llmgw plane leave`), and without
    --force for a healthy member or when the members left would lose their quorum.
    """
    answer = call(settings, "DELETE", api_path("planes", name), RemoveIn(force=force))
    if as_json:
        echo_json(answer)
    else:
        gone = decoded(answer, PlaneRemoved)
        click.echo(f"Control plane {name} removed (etcd member {gone.member}).")


@click.command("planes")
@listing_options
@pass_settings
def planes(settings: Settings, out: Listing) -> None:
    """List the control planes: address, etcd member and its health, and who leads.

    HEALTH is the member as this control plane's member sees it (healthy, unreachable, not
    started), "(learner)" while a joined member has not caught up and been promoted to a
    voter; ROLE is leader or standby, empty where no llmgwd runs now; VERSION is its
    llmgwd's release. -o wide adds the address its etcd member's peers reach it at.
    """
    answer = call(settings, "GET", f"{API}/planes")
    if out.raw(answer):
        return
    rows = [
        [
            s.name + (" (this one)" if s.self else ""),
            s.url or "-",
            s.member or "-",
            s.health + (" (learner)" if s.learner else ""),
            s.role or "-",
            s.version or "-",
            s.peer_url or "-",
        ]
        for s in decoded(answer, list[PlaneView])
    ]
    headers = ["NAME", "ADDRESS", "MEMBER", "HEALTH", "ROLE", "VERSION", "PEER ADDRESS"]
    out.table(headers, rows, "One control plane on SQLite: no etcd members.", shown=6)
