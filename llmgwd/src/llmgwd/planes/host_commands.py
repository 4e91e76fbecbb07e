"""`llmgwd join` and `llmgwd migrate`: this host's side of `llmgw plane join` and `llmgw plane
migrate`, which run them (so that the shared package imports no daemon)."""

from __future__ import annotations

import asyncio
import contextlib
import pwd
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import click

from llmgw import config, sealed
from llmgw.cli import backup as cli_backup
from llmgw.cli.common import Refused, Settings
from llmgw.cli.plane import default_advertise, systemd_running, wait_for_llmgwd, write_config
from llmgw.cli.units import ETCD_UNIT, LLMGWD_UNIT, peer_ip, progress, systemctl
from llmgwd import daemon
from llmgwd.planes import backup, etcd_member, join_host, migrate_host
from llmgwd.planes.migrate import Copied

USER = "llmgw"  # llmgwd's and the member's user, made by the package

socket_option = click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    default=config.ServerConfig().socket,
    show_default=True,
    help="llmgwd's Unix socket, where the new llmgwd is waited for.",
)
config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=config.SERVER_CONFIG,
    show_default=True,
    help="This host's server.yaml.",
)
peer_ip_option = click.option("--peer-ip", "peer_ip_", metavar="IP", help="This etcd member's IP.")


@click.group("llmgwd")
def host() -> None:
    """This host's side of `llmgw plane join` and `llmgw plane migrate`, which run these
    (see llmgw(1)); `llmgwd` alone runs the control plane."""


def settings(socket_path: str) -> Settings:
    """The CLI's settings, for waiting on llmgwd's socket."""
    return Settings(socket=socket_path, agent_socket=config.AgentConfig().socket)


@host.command("join")
@click.argument("url")
@click.option("--token", required=True, envvar="LLMGW_SERVER_TOKEN", help="The plane token.")
@click.option("--advertise", metavar="URL", help="This host's cluster port as nodes reach it.")
@peer_ip_option
@config_option
@click.option("--wait", "wait_s", type=click.FloatRange(min=1), default=300.0, show_default=True)
@socket_option
def join(url: str, token: str, advertise: str | None, peer_ip_: str | None, config_path: Path,
         wait_s: float, socket_path: str) -> None:  # fmt: skip
    """Join the cluster whose cluster port is URL as one more control plane
    (`llmgw plane join`)."""
    cfg = config.ServerConfig(socket=socket_path)
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
    _start(settings(socket_path), cfg, name, wait_s)


def _start(settings: Settings, cfg: config.ServerConfig, name: str, wait_s: float) -> None:
    """llmgw-etcd, then (once its member is a voter) llmgwd."""
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
            f"-u {ETCD_UNIT}` here and `llmgw planes` on a control plane; llmgwd not started"
        )
    took = time.monotonic() - started
    progress(f"The member was promoted to a voter after {took:.1f} s; starting {LLMGWD_UNIT} ...")
    systemctl("start", LLMGWD_UNIT)
    wait_for_llmgwd(settings, 60.0)
    click.echo(f"Control plane {name} joined cluster {cfg.name}; `llmgw planes` lists them all.")


@host.command("migrate")
@click.option("--to", "target", type=click.Choice(["etcd"]), required=True)
@peer_ip_option
@config_option
@socket_option
def migrate(target: str, peer_ip_: str | None, config_path: Path, socket_path: str) -> None:
    """Move this control plane's store from SQLite into etcd (`llmgw plane migrate`)."""
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
        wait_for_llmgwd(settings(socket_path), 60.0)
    click.echo(f"Control plane {name} now keeps the cluster's state in etcd (member {name}); "
               f"the SQLite store is kept at {backup}. `llmgw plane token` adds a control "
               "plane.")  # fmt: skip


def _copy(cfg: config.ServerConfig, state_dir: Path, name: str, ip: str, systemd: bool) -> Copied:
    migrate_host.write_first_member(etcd_member.CONFIG_PATH, state_dir, name, ip)
    progress(f"Wrote {etcd_member.CONFIG_PATH}: member {name}, peers at {etcd_member.peer_url(ip)}")
    if systemd:
        systemctl("enable", ETCD_UNIT)
        systemctl("start", "--no-block", ETCD_UNIT)
        progress(f"Started {ETCD_UNIT}; copying state.db into it ...")
    return asyncio.run(migrate_host.copy(cfg, state_dir))


@host.command("restore")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--passphrase-file", required=True, type=click.Path(exists=True, dir_okay=False))
@config_option
@socket_option
@click.option("--no-start", is_flag=True)
def restore(file: Path, passphrase_file: str, config_path: Path, socket_path: str,
            no_start: bool) -> None:  # fmt: skip
    """Bring a cluster back on this fresh host from `llmgw backup`'s FILE (`llmgw restore`)."""
    with _opened(file, passphrase_file) as opened:
        bundle = opened.bundle
        try:
            user = pwd.getpwnam(USER)
        except KeyError:
            raise Refused(f"there is no user {USER}: install the llmgwd package first") from None
        progress(f"Restoring {cli_backup.describe(bundle)} ...")
        owner = (user.pw_uid, user.pw_gid)
        try:  # the store staged as the file is read and verified to its end, then the rest
            cfg = backup.restore(bundle, None, config_path, owner, opened.copy_store)
        except backup.RestoreRefused as e:
            raise Refused(str(e)) from None
        except (OSError, sealed.SealError) as e:
            raise Refused(f"{file}: {e}; nothing was written") from None
    progress(f"Wrote {config_path}, the store, the cluster CA and secret under {cfg.state_dir}")
    if bundle.files:
        progress("Wrote the files the settings name: " + ", ".join(f.path for f in bundle.files))
    where = daemon.advertise_url(cfg)
    if not no_start and systemd_running():
        systemctl("enable", LLMGWD_UNIT)
        systemctl("start", LLMGWD_UNIT)
        wait_for_llmgwd(settings(socket_path), 60.0)
    elif not no_start:
        progress("systemd is not this system's init: start llmgwd yourself.")
    click.echo(f"Cluster {cfg.name} restored on this host. Its nodes reconnect once it answers "
               f"at {where}, the address they know; `llmgw nodes` shows them.")  # fmt: skip


@contextlib.contextmanager
def _opened(file: Path, passphrase_file: str) -> Iterator[cli_backup.Opened]:
    """The backup file opened (a chunk at a time: its store read by copy_store)."""
    try:
        phrase = sealed.read_passphrase(passphrase_file)
        f = file.open("rb")
    except (OSError, UnicodeDecodeError, sealed.SealError) as e:
        raise Refused(f"{file}: {e}; nothing was written") from None
    with f:
        try:
            opened = cli_backup.open_backup(f, phrase)
        except (OSError, sealed.SealError) as e:
            raise Refused(f"{file}: {e}; nothing was written") from None
        yield opened


def _said(e: Exception) -> str:
    """What failed, without a traceback (a store's error names a key, never a value)."""
    return str(e) or type(e).__name__


def run(argv: list[str]) -> None:
    """`llmgwd join ...` or `llmgwd migrate ...`: exits with the command's status."""
    host.main(argv, prog_name="llmgwd")
