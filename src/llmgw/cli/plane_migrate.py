"""llmgw plane migrate --to etcd: a one-machine SQLite cluster's store moved into this host's
new etcd member, the first of an etcd cluster that more control planes can join; `llmgwd
migrate` does it."""

from __future__ import annotations

from pathlib import Path

import click

from llmgw import config
from llmgw.cli.common import Settings, pass_settings
from llmgw.cli.units import need_llmgwd, peer_ip, run_llmgwd


@click.command("migrate")
@click.option(
    "--to", "target", type=click.Choice(["etcd"]), required=True, help="The store to move to."
)
@click.option(
    "--peer-ip",
    "peer_ip_",
    metavar="IP",
    help="The address other etcd members will reach this one at [default: the "
    "advertised host if an address, else the main IP].",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=config.SERVER_CONFIG,
    show_default=True,
    help="This host's server.yaml.",
)
@pass_settings
def migrate(settings: Settings, target: str, peer_ip_: str | None, config_path: Path) -> None:
    """Move this control plane's store from SQLite into etcd, nothing lost.

    Stops llmgwd, starts this host's etcd member (llmgw-etcd) as the first of a new cluster,
    copies every key of state.db into it and reads them back, keeps state.db aside as the
    backup (state.db.before-etcd), sets server.yaml's store to etcd and starts llmgwd again.
    The nodes' engines go on running throughout. Refused once the store is etcd.
    """
    need_llmgwd()
    args = ["migrate", "--to", target, "--config", str(config_path), "--socket", settings.socket]
    if peer_ip_:  # checked here, so that a usage error names this command
        args += ["--peer-ip", peer_ip(peer_ip_, "")]
    run_llmgwd(args)  # llmgwd.planes.host_commands.migrate
