"""llmgw server join: make this host a control plane of a running cluster (whose store is
etcd), with a server token from `llmgw server token`."""

from __future__ import annotations

import asyncio
import pwd
import time
from pathlib import Path
from urllib.parse import urlsplit

import click

from llmgw import config
from llmgw.cli.common import Refused, Settings, pass_settings
from llmgw.cli.server import default_advertise, systemd_running, wait_for_llmgwd, write_config
from llmgw.cli.units import ETCD_UNIT, LLMGWD_UNIT, need_llmgwd, peer_ip, progress, systemctl

USER = "llmgw"  # llmgwd's and the member's user, made by the package


@click.command("join")
@click.argument("url")
@click.option(
    "--token",
    required=True,
    envvar="LLMGW_SERVER_TOKEN",
    help="The server token `llmgw server token` printed (env LLMGW_SERVER_TOKEN).",
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
    from llmgwd import etcd_member, join_host

    cfg = config.ServerConfig(socket=settings.socket)
    state_dir = Path(cfg.state_dir)
    if config_path.exists():
        raise Refused(f"{config_path} exists: this host is set up as a control plane already")
    if (state_dir / "pki" / etcd_member.CA_CERT).exists():
        raise Refused(f"{state_dir}/pki holds a cluster CA already: this host has been a "
                      "control plane; remove its state to join another cluster")  # fmt: skip
    if advertise is not None and not advertise.startswith("https://"):
        raise click.BadParameter("must be https://HOST:PORT", param_hint="--advertise")
    cfg.cluster.advertise = advertise or default_advertise(cfg.cluster.listen)
    name = urlsplit(cfg.cluster.advertise).hostname or ""
    ip = peer_ip(peer_ip_, cfg.cluster.advertise)
    try:
        user = pwd.getpwnam(USER)
    except KeyError:
        raise Refused(f"there is no user {USER}: install the llmgwd package first") from None
    progress(f"Joining {url} as control plane {name} (etcd peer {etcd_member.peer_url(ip)}) ...")
    try:
        said = lambda why: progress(f"Not yet: {why}")  # noqa: E731
        answer = asyncio.run(
            join_host.ask(url, token, name, etcd_member.peer_url(ip), on_retry=said)
        )
    except join_host.JoinFailed as e:
        raise Refused(str(e)) from None
    progress(f"Admitted to cluster {answer.cluster}: writing its CA, secret and etcd config")
    join_host.write_keys(state_dir, answer, (user.pw_uid, user.pw_gid))
    join_host.write_member(etcd_member.CONFIG_PATH, state_dir, name, ip, answer.members)
    cfg.name = answer.cluster
    cfg.store.backend = "etcd"
    write_config(config_path, cfg, force=False)
    _start(settings, cfg, name, wait_s)


def _start(settings: Settings, cfg: config.ServerConfig, name: str, wait_s: float) -> None:
    """llmgw-etcd, then (once its member is a voter) llmgwd."""
    from llmgwd import join_host

    if not systemd_running():
        progress("systemd is not this system's init: start llmgw-etcd, then llmgwd, yourself.")
        return
    systemctl("enable", ETCD_UNIT, LLMGWD_UNIT)
    systemctl("start", "--no-block", ETCD_UNIT)
    progress(f"Started {ETCD_UNIT}; waiting for its member to catch up and be promoted ...")
    started = time.monotonic()
    if not asyncio.run(join_host.wait_voter(cfg, wait_s)):
        raise Refused(
            f"this host's etcd member is still a learner after {wait_s:g} s: see `journalctl "
            f"-u {ETCD_UNIT}` here and `llmgw servers` on a control plane; llmgwd not started"
        )
    took = time.monotonic() - started
    progress(f"The member was promoted to a voter after {took:.1f} s; starting {LLMGWD_UNIT} ...")
    systemctl("start", LLMGWD_UNIT)
    wait_for_llmgwd(settings, 60.0)
    click.echo(f"Control plane {name} joined cluster {cfg.name}; `llmgw servers` lists them all.")
