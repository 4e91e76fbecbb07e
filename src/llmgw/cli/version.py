"""llmgw version: this CLI's release, the control plane's it talks to, and the cluster's (each
control plane's llmgwd and each node's llmgw-agentd)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import click
import msgspec

from llmgw import package_version
from llmgw.api_types import NodeView, PlaneView, StatusView
from llmgw.cli.common import API, Settings, call, decoded, pass_settings
from llmgw.cli.output import echo_json, json_option

NAMED = 3  # a release run by this many hosts or fewer names them


class Host(msgspec.Struct, frozen=True):
    """One daemon's release, for --json."""

    name: str
    version: str


class Versions(msgspec.Struct, frozen=True, kw_only=True):
    """What `llmgw version --json` prints."""

    cli: str
    llmgwd: str  # the control plane that answered
    cluster: str  # its name
    planes: list[Host]
    nodes: list[Host]


def releases(hosts: Iterable[Host]) -> str:
    """'0.2.0 (3), 0.1.0 (1: n5)': each release, the newest first, with its hosts."""
    by: defaultdict[str, list[str]] = defaultdict(list)
    for h in hosts:
        by[h.version or "unknown"].append(h.name)
    parts = []
    for v, names in sorted(by.items(), key=lambda kv: _key(kv[0]), reverse=True):
        named = f": {', '.join(sorted(names))}" if len(by) > 1 and len(names) <= NAMED else ""
        parts.append(f"{v} ({len(names)}{named})")
    return ", ".join(parts) or "none"


def _key(release: str) -> tuple[tuple[int, ...], str]:
    """A release's sort key: its leading numbers, then the rest."""
    nums = []
    for part in release.split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        nums.append(int(digits))
    return tuple(nums), release


def gather(settings: Settings) -> Versions:
    """Every version, asked of the control plane the settings reach."""
    status = decoded(call(settings, "GET", f"{API}/status"), StatusView)
    planes = decoded(call(settings, "GET", f"{API}/planes"), list[PlaneView])
    nodes = decoded(call(settings, "GET", f"{API}/nodes"), list[NodeView])
    return Versions(
        cli=package_version(),
        llmgwd=status.version,
        cluster=status.name,
        planes=[Host(name=p.name, version=p.version) for p in planes if p.url],
        nodes=[Host(name=n.name, version=n.version) for n in nodes],
    )


@click.command("version")
@json_option
@pass_settings
def version(settings: Settings, as_json: bool) -> None:
    """Print the releases: this llmgw's, the llmgwd it talks to (the local one, or the
    context's), and the cluster's: every running control plane's llmgwd and every node's
    llmgw-agentd, each release with how many run it (and which, when they differ).

    An agent one release behind its control planes keeps working; control planes of two
    adjacent releases run together (llmgw-cluster(7), BACKUP AND UPGRADE).
    """
    if not as_json:
        click.echo(f"llmgw (this command): {package_version()}")
    found = gather(settings)
    if as_json:
        echo_json(found)
        return
    here = "the context's" if settings.remote() is not None else "this host's"
    click.echo(f"llmgwd ({here}):      {found.llmgwd}")
    click.echo(f"control planes:       {releases(found.planes)}")
    click.echo(f"node agents:          {releases(found.nodes)}")
