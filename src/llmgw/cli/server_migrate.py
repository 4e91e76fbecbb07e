"""llmgw server migrate --to etcd: a one-machine SQLite cluster's store moved into this host's
new etcd member, the first of an etcd cluster that more control planes can join."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import click

from llmgw import config
from llmgw.cli.common import Refused, Settings, pass_settings
from llmgw.cli.server import systemd_running, wait_for_llmgwd
from llmgw.cli.units import ETCD_UNIT, LLMGWD_UNIT, need_llmgwd, peer_ip, progress, systemctl

if TYPE_CHECKING:
    from llmgwd.migrate import Copied


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
    from llmgwd import daemon, migrate_host

    try:
        cfg = config.load(config_path, config.ServerConfig)
        state_dir = Path(cfg.state_dir)
        migrate_host.check(cfg, state_dir)
    except (config.ConfigError, migrate_host.MigrationRefused) as e:
        raise Refused(str(e)) from None
    url = daemon.advertise_url(cfg)
    name, ip = daemon.server_name(url), peer_ip(peer_ip_, url)
    systemd = systemd_running()
    if systemd:
        progress(f"Stopping {LLMGWD_UNIT} (the nodes' engines keep running) ...")
        systemctl("stop", LLMGWD_UNIT)
    try:
        copied = _copy(cfg, state_dir, name, ip, systemd)
    except Exception as e:
        if systemd:
            systemctl("disable", "--now", ETCD_UNIT)
            systemctl("start", LLMGWD_UNIT)
        again = " llmgwd runs on SQLite again." if systemd else ""
        raise Refused(f"the migration failed, state.db is untouched: {_said(e)}.{again}") from None
    backup = migrate_host.set_aside(state_dir)
    migrate_host.switch_config(config_path)
    progress(f"Copied {copied.keys} keys ({copied.bytes} bytes); state.db kept as {backup}")
    if copied.leased:
        progress(f"Not copied: {len(copied.leased)} leased keys (join tokens, liveness records)")
    if systemd:
        progress(f"{config_path}: store.backend etcd; starting {LLMGWD_UNIT} ...")
        systemctl("start", LLMGWD_UNIT)
        wait_for_llmgwd(settings, 60.0)
    click.echo(f"Control plane {name} now keeps the cluster's state in etcd (member {name}); "
               f"the SQLite store is kept at {backup}. `llmgw server token` adds a control "
               "plane.")  # fmt: skip


def _copy(cfg: config.ServerConfig, state_dir: Path, name: str, ip: str, systemd: bool) -> Copied:
    from llmgwd import etcd_member, migrate_host

    migrate_host.write_first_member(etcd_member.CONFIG_PATH, state_dir, name, ip)
    progress(f"Wrote {etcd_member.CONFIG_PATH}: member {name}, peers at {etcd_member.peer_url(ip)}")
    if systemd:
        systemctl("enable", ETCD_UNIT)
        systemctl("start", "--no-block", ETCD_UNIT)
        progress(f"Started {ETCD_UNIT}; copying state.db into it ...")
    return asyncio.run(migrate_host.copy(cfg, state_dir))


def _said(e: Exception) -> str:
    """What failed, without a traceback (a store's error names a key, never a value)."""
    return str(e) or type(e).__name__
