"""llmgw upgrade stage|start|status|resume|abort: the cluster rolled onto new packages, control
planes one at a time (the leader last), then the nodes."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import click

from llmgw.api_types import StagedPackage, UpgradeHost, UpgradeRoll, UpgradeStartIn, UpgradeView
from llmgw.cli.common import API, Settings, Unreachable, call, decoded, pass_settings
from llmgw.cli.mirror import put_file
from llmgw.cli.output import ago, echo_json, json_option, size, table

WATCH_EVERY_S = 2.0
RESTART_WAIT_S = 300.0  # how long --watch waits for an llmgwd that cannot be reached


@click.group()
def upgrade() -> None:
    """Roll the cluster onto staged packages: each host fetches them from the mirror,
    installs them through a transient unit and restarts on them (engines run on)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@upgrade.command()
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@json_option
@pass_settings
def stage(settings: Settings, files: tuple[Path, ...], as_json: bool) -> None:
    """Send FILES (.deb and .rpm packages of llmgw, llmgwd, llmgw-agentd) to llmgwd, which
    keeps them by sha256 in the mirror and reads their name, version and arch from them."""
    staged = []
    for path in files:
        n = path.stat().st_size
        click.echo(f"{path.name}: {size(n)}, uploading", err=True)
        answer = put_file(settings, f"{API}/upgrade/packages/{_sha256(path)}", path, n)
        staged.append(answer)
    if as_json:
        echo_json(staged)
        return
    for p in (decoded(a, StagedPackage) for a in staged):
        click.echo(f"Staged {p.name} {p.version} ({p.kind}, {p.arch}, {size(p.size)}): "
                   f"release {p.release}, sha256 {p.sha256[:12]}")  # fmt: skip


@upgrade.command()
@click.option(
    "--nodes",
    default=None,
    metavar="NAME,...",
    help="Only these nodes (the control planes' hosts always); '' for none.",
)
@click.option(
    "--release",
    default="",
    help="The staged release to roll (several staged); with --from-repositories, the version.",
)
@click.option(
    "--from-repositories",
    is_flag=True,
    help="Nothing staged: each host installs its llmgw packages at --release from its own "
    "apt or dnf repositories (through network.proxy).",
)
@click.option("--parallel", default=4, show_default=True, help="Nodes upgraded at once.")
@click.option(
    "--wait", is_flag=True, help="Follow the roll until it ends, as `status --watch` does."
)
@json_option
@pass_settings
def start(
    settings: Settings,
    nodes: str | None,
    release: str,
    from_repositories: bool,
    parallel: int,
    wait: bool,
    as_json: bool,
) -> None:
    """Start a roll: the control planes' hosts one at a time (the leader last), then the
    nodes, PARALLEL at once. `llmgw upgrade status --watch` follows it; with --wait this
    command does, and exits 1 when the roll halts."""
    chosen = None if nodes is None else [n for n in nodes.split(",") if n]
    body = UpgradeStartIn(nodes=chosen, release=release, parallel=parallel,
                          from_repositories=from_repositories)  # fmt: skip
    answer = call(settings, "POST", f"{API}/upgrade/start", body)
    if as_json:
        echo_json(answer)
    else:
        r = decoded(answer, UpgradeRoll)
        click.echo(f"Roll {r.id} to {r.release} started: {len(r.hosts)} hosts.")
        if not wait:
            click.echo("Follow it with: llmgw upgrade status --watch")
    if wait:
        _watch(settings)


@upgrade.command()
@click.option("--watch", is_flag=True, help="Show it again as it changes, until it ends.")
@json_option
@pass_settings
def status(settings: Settings, watch: bool, as_json: bool) -> None:
    """What is staged, and each host's step (fetching bytes of total, installing,
    restarting, done, failed and why) and release. With --watch, llmgwd's own restart onto
    the new release is waited out, and the exit status is 1 when the roll halts."""
    if not watch:
        answer = call(settings, "GET", f"{API}/upgrade")
        if as_json:
            echo_json(answer)
        else:
            click.echo(render(decoded(answer, UpgradeView)))
        return
    _watch(settings)


def _watch(settings: Settings) -> None:
    """The roll shown again as it changes until nothing more happens without a person;
    exit status 1 when it halted."""
    said = ""
    while True:
        view = _view_waiting(settings)
        text = render(view)
        if text != said:
            click.echo(text)
            said = text
        if view.roll is None or _settled(view.roll):
            break
        time.sleep(WATCH_EVERY_S)
    if view.roll is not None and view.roll.state == "halted":
        raise SystemExit(1)


def _view_waiting(settings: Settings) -> UpgradeView:
    """GET /upgrade, asked again while llmgwd cannot be reached (it restarts in a roll)."""
    deadline = time.monotonic() + RESTART_WAIT_S
    while True:
        try:
            return decoded(call(settings, "GET", f"{API}/upgrade"), UpgradeView)
        except Unreachable as e:
            if time.monotonic() > deadline:
                raise
            click.echo(f"{e.message}; asking again", err=True)
            time.sleep(WATCH_EVERY_S)


def _settled(r: UpgradeRoll) -> bool:
    """Nothing more happens without a person: done, halted or aborted, none in flight."""
    moving = any(h.step in ("fetching", "installing", "restarting") for h in r.hosts)
    return r.state != "running" and not moving


def render(view: UpgradeView, now: float | None = None) -> str:
    """`llmgw upgrade status`'s text."""
    lines = []
    for p in view.staged:
        lines.append(f"Staged: {p.filename} (release {p.release}, {size(p.size)})")
    r = view.roll
    if r is None:
        lines.append("No roll started." if view.staged else "Nothing staged, no roll started.")
        return "\n".join(lines)
    lines.append(
        f"Roll {r.id} to {r.release}{' from the repositories' if r.from_repositories else ''}: "
        f"{r.state}, started {ago(r.started_at, now)}, {r.parallel} nodes at once"
    )
    rows = [(h.name, h.role, h.step, _progress(h), h.version or "-", h.message) for h in r.hosts]
    lines.append(table(["HOST", "ROLE", "STEP", "PROGRESS", "RELEASE", "NOTE"], rows))
    if r.state == "halted":
        lines.append(f"Halted: {r.error}")
        lines.append("`llmgw upgrade resume` tries it again; `llmgw upgrade abort` ends the roll.")
    elif r.state == "aborted":
        lines.append("Aborted: no other host starts; hosts done stay upgraded.")
    return "\n".join(lines)


def _progress(h: UpgradeHost) -> str:
    if h.step == "fetching" and h.total_bytes:
        pct = 100 * h.done_bytes // h.total_bytes
        return f"{pct}%, {size(h.done_bytes)} of {size(h.total_bytes)}"
    return ""


@upgrade.command()
@json_option
@pass_settings
def resume(settings: Settings, as_json: bool) -> None:
    """Carry a halted roll on: its failed hosts are tried again, then the rest."""
    _act(settings, "resume", as_json)


@upgrade.command()
@json_option
@pass_settings
def abort(settings: Settings, as_json: bool) -> None:
    """End the roll: no other host starts; hosts in flight finish, hosts done stay upgraded."""
    _act(settings, "abort", as_json)


def _act(settings: Settings, action: str, as_json: bool) -> None:
    answer = call(settings, "POST", f"{API}/upgrade/{action}")
    if as_json:
        echo_json(answer)
        return
    r = decoded(answer, UpgradeRoll)
    click.echo(f"Roll {r.id} to {r.release}: {r.state}.")
