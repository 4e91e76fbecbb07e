"""llmgw plane join: make this host a control plane of a running cluster (whose store is
etcd), with a plane token from `llmgw plane token`; `llmgwd join` does this host's side."""

from __future__ import annotations

from pathlib import Path

import click

from llmgw import config
from llmgw.cli.common import Settings, pass_settings
from llmgw.cli.units import need_llmgwd, peer_ip, run_llmgwd


@click.command("join")
@click.argument("url")
@click.option(
    "--token",
    required=True,
    envvar=["LLMGW_PLANE_TOKEN", "LLMGW_SERVER_TOKEN"],  # the old name, still read
    help="The plane token `llmgw plane token` printed (env LLMGW_PLANE_TOKEN).",
)
@click.option(
    "--advertise",
    metavar="URL",
    help="This host's cluster port as nodes reach it [default: https://<main IP>:7710].",
)
@click.option(
    "--peer-ip",
    "peer_ip_",
    metavar="IP",
    help="The address the other etcd members reach this one at [default: the "
    "advertised host if an address, else the main IP].",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=config.SERVER_CONFIG,
    show_default=True,
    help="The server.yaml to write.",
)
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds to wait for this host's member to catch up and be promoted.",
)
@pass_settings
def join(settings: Settings, url: str, token: str, advertise: str | None, peer_ip_: str | None,
         config_path: Path, wait_s: float) -> None:  # fmt: skip
    """Join the cluster whose cluster port is URL as one more control plane.

    Fetches the cluster's CA from URL and checks it against the token, then (over HTTPS
    trusting only that CA) trades the token for the CA's key, the cluster secret and a place
    among the store's etcd members; writes them, this member's config and server.yaml; starts
    llmgw-etcd, waits for its member to be promoted from learner to voter, then starts llmgwd
    as a standby. Run as root on a host with llmgwd installed and no server.yaml.
    """
    need_llmgwd()
    if advertise is not None and not advertise.startswith("https://"):
        raise click.BadParameter("must be https://HOST:PORT", param_hint="--advertise")
    args = ["join", url, "--config", str(config_path), "--wait", repr(wait_s)]
    args += ["--socket", settings.socket]
    if advertise is not None:
        args += ["--advertise", advertise]
    if peer_ip_:  # checked here, so that a usage error names this command
        args += ["--peer-ip", peer_ip(peer_ip_, "")]
    run_llmgwd(args, env={"LLMGW_SERVER_TOKEN": token})  # llmgwd.planes.host_commands.join
