"""llmgw plane init and llmgw status: setting up and looking at the control plane."""

from __future__ import annotations

import grp
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import click

from llmgw import config, ipc
from llmgw.api_types import SlurmSettingsIn, StatusView
from llmgw.cli.common import (
    API,
    Refused,
    Settings,
    Unreachable,
    call,
    decoded,
    local,
    pass_settings,
)
from llmgw.cli.node import echo_join_command
from llmgw.cli.output import echo_json, json_option

LLMGW_GROUP = "llmgw"  # the package's: llmgwd runs as it, server.yaml is of it
SYSTEMD_RUNTIME = Path("/run/systemd/system")  # exists only when systemd is PID 1 (sd_booted)


def main_ip() -> str | None:
    """The address this host's default route leaves from, or None without one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET: a UDP connect sends nothing
            ip: str = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith(("0.", "127.")) else ip


def default_advertise(cluster_listen: str) -> str:
    """https://<main IP or host name>:<cluster port>, as nodes will dial it."""
    port = cluster_listen.rpartition(":")[2] or "7710"
    return f"https://{main_ip() or socket.gethostname()}:{port}"


def systemd_running() -> bool:
    """Whether systemd is this system's init (so systemctl can start llmgwd)."""
    return SYSTEMD_RUNTIME.is_dir()


def start_llmgwd() -> None:
    """systemctl enable --now llmgwd; its complaint becomes ours."""
    res = subprocess.run(
        ["systemctl", "enable", "--now", "llmgwd"], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        why = res.stderr.strip() or f"exit status {res.returncode}"
        raise Refused(f"systemctl enable --now llmgwd failed: {why}")


def write_config(path: Path, cfg: config.ServerConfig, force: bool) -> None:
    """Write server.yaml atomically, 0640 of llmgw's group as restore does (config.write_server);
    an existing one is kept unless force."""
    if path.exists() and not force:
        raise Refused(f"{path} exists: use --force to overwrite it")
    config.write_server(path, cfg, "written by `llmgw plane init`", _llmgw_gid())


def _llmgw_gid() -> int | None:
    """The llmgw group's number, as root where the package made it (else None: ours)."""
    if os.geteuid() != 0:
        return None
    try:
        return grp.getgrnam(LLMGW_GROUP).gr_gid
    except KeyError:
        return None


def wait_for_llmgwd(settings: Settings, timeout_s: float) -> None:
    """Poll the socket until llmgwd answers, saying so once; bounded by timeout_s."""
    click.echo(f"Waiting for llmgwd to answer on {settings.socket} ...", err=True)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status, _ = ipc.request(settings.socket, "GET", f"{API}/status", timeout=2.0)
            if status == 200:
                return
        except ipc.IpcError:
            pass  # not up yet
        if time.monotonic() >= deadline:
            raise Unreachable(
                f"llmgwd did not answer on {settings.socket} within {timeout_s:g} s: "
                "see `journalctl -u llmgwd`"
            )
        time.sleep(0.25)


def _started(settings: Settings, path: Path, wait_s: float) -> dict[str, Any] | None:
    """Start llmgwd and get a join token; None when this host has no systemd."""
    if not systemd_running():
        click.echo(
            f"systemd is not this system's init: start llmgwd yourself (llmgwd --config {path}),"
            " then `llmgw node token` prints the command that joins a node.",
            err=True,
        )
        return None
    start_llmgwd()
    wait_for_llmgwd(settings, wait_s)
    answer: dict[str, Any] = call(settings, "POST", f"{API}/tokens")
    return answer


@click.group()
def plane() -> None:
    """Set up this host as a control plane of the cluster, and add or take out others.

    `llmgw server` and `llmgw servers`, the old names of `llmgw plane` and `llmgw planes`,
    still work.
    """


@plane.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=config.SERVER_CONFIG,
    show_default=True,
    help="The file to write.",
)
@click.option(
    "--advertise",
    metavar="URL",
    help="The cluster port's URL as nodes reach it [default: https://<main IP>:7710].",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=config.ServerConfig().state_dir,
    show_default=True,
    help="Where llmgwd keeps its store, CA and cluster secret.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing config file.")
@click.option("--no-start", is_flag=True, help="Only write the config; do not start llmgwd.")
@click.option(
    "--slurm",
    "with_slurm",
    is_flag=True,
    help="Turn Slurm on, with this host's node as its controller once it joins.",
)
@click.option(
    "--all-nodes/--no-all-nodes",
    default=True,
    show_default=True,
    help="With --slurm: every node runs slurmd, those joining later too (slurm.all_nodes).",
)
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds to wait for llmgwd to come up.",
)
@json_option
@pass_settings
def init(
    settings: Settings,
    config_path: Path,
    advertise: str | None,
    state_dir: Path,
    force: bool,
    no_start: bool,
    with_slurm: bool,
    all_nodes: bool,
    wait_s: float,
    as_json: bool,
) -> None:
    """Write server.yaml, start llmgwd and print the command that joins a node.

    llmgwd makes the cluster's CA and secret in its state directory when it first starts.
    Without systemd as init, init says how to start llmgwd and exits 0.

    With --slurm, Slurm is turned on once llmgwd answers: its controller is this host's
    node (named as its agent names it, the host name), which runs slurmctld once it joins,
    and every node runs slurmd, those that join later too (slurm.all_nodes). With
    --no-all-nodes no node is in Slurm yet (`llmgw slurm setup --controller NAME --nodes A,B`
    names them after they join). Without llmgwd started here, --slurm only says the command.
    """
    if advertise is not None and not advertise.startswith("https://"):
        raise click.BadParameter("must be https://HOST:PORT", param_hint="--advertise")
    settings = local(settings)  # this host's llmgwd, whatever the context
    cfg = config.ServerConfig(state_dir=str(state_dir), socket=settings.socket)
    cfg.cluster.advertise = advertise or default_advertise(cfg.cluster.listen)
    write_config(config_path, cfg, force)
    state_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
    if not as_json:
        click.echo(f"Wrote {config_path} (nodes will dial {cfg.cluster.advertise}).")
    token = None if no_start else _started(settings, config_path, wait_s)
    if with_slurm:
        _slurm_on(settings, all_nodes, started=token is not None, quiet=as_json)
    if as_json:
        started = token is not None
        echo_json(
            {
                "config": str(config_path),
                "advertise": cfg.cluster.advertise,
                "started": started,
                "token": token,
            }
        )
    elif token is not None:
        echo_join_command(token)
        _echo_pin(settings, cfg.client.listen)


def _echo_pin(settings: Settings, client_listen: str) -> None:
    """The command an operator elsewhere reaches this cluster with, its CA pinned."""
    s = decoded(call(settings, "GET", f"{API}/status"), StatusView)
    if s.ca_fingerprint:
        port = client_listen.rpartition(":")[2]
        url = f"https://{main_ip() or socket.gethostname()}:{port}"
        click.echo("Run llmgw from another machine with this context (the cluster CA pinned):")
        click.echo(f"  llmgw context add NAME {url} --ca-fingerprint {s.ca_fingerprint}")


def _slurm_on(settings: Settings, all_nodes: bool, started: bool, quiet: bool) -> None:
    """Slurm on with this host's node as controller, slurmd on every node unless not
    all_nodes; without llmgwd up, how to do it."""
    name = socket.gethostname()
    nodes = "--all-nodes" if all_nodes else "--nodes NODES"
    if not started:
        click.echo(f"Slurm: once llmgwd runs, `llmgw slurm setup --controller {name} "
                   f"{nodes}` turns it on.", err=True)  # fmt: skip
        return
    on = SlurmSettingsIn(enabled=True, controller=name, all_nodes=all_nodes)
    call(settings, "PUT", f"{API}/slurm", on)
    if quiet:
        return
    click.echo(f"Slurm is on: slurmctld runs on node {name} once it joins.")
    if all_nodes:
        click.echo("slurmd runs on every node, those joining later too (slurm.all_nodes).")
    else:
        click.echo("No node runs slurmd yet: `llmgw slurm setup --nodes A,B` names them.")


@click.command()
@json_option
@pass_settings
def status(settings: Settings, as_json: bool) -> None:
    """Show the cluster at a glance: version, nodes, models and replicas."""
    answer = call(settings, "GET", f"{API}/status")
    if as_json:
        echo_json(answer)
        return
    s = decoded(answer, StatusView)
    click.echo(f"{s.name}: llmgwd {s.version}, up {int(s.uptime_s)} s")
    if s.mode == "mirror":
        click.echo("mode:     a model mirror alone (no nodes, nothing served; /hf for clusters)")
        click.echo(f"models:   {s.models.total} in its catalog")
        if s.ca_fingerprint:
            click.echo(f"CA sha256: {s.ca_fingerprint}")
        return
    click.echo(f"nodes:    {s.nodes.connected}/{s.nodes.total} connected")
    click.echo(f"models:   {s.models.served}/{s.models.total} served")
    click.echo(f"replicas: {s.replicas.ready}/{s.replicas.wanted} ready")
    click.echo(f"join URL: {s.join_url}")
    if s.ca_fingerprint:
        click.echo(f"CA sha256: {s.ca_fingerprint}")
