"""llmgw backup FILE and llmgw restore FILE: the cluster's whole state sealed with a passphrase
(llmgw.sealed), and brought back on a fresh host by `llmgwd restore`."""

from __future__ import annotations

import datetime
from pathlib import Path

import click
import msgspec

from llmgw import atomic, config, sealed
from llmgw.api_types import BUNDLE_FORMAT, BackupBundle
from llmgw.cli.common import API, Refused, Settings, call, decoded, pass_settings
from llmgw.cli.units import run_llmgwd

passphrase_option = click.option(
    "--passphrase-file",
    type=click.Path(exists=True, dir_okay=False),
    required=True,
    help="A file whose first line is the passphrase (12 characters at least).",
)


def seal_bundle(bundle: BackupBundle, passphrase: str) -> bytes:
    """The bundle as a backup file's bytes."""
    return sealed.seal(msgspec.msgpack.encode(bundle), passphrase)


def open_bundle(data: bytes, passphrase: str) -> BackupBundle:
    """A backup file's bundle; sealed.SealError when it cannot be opened or read."""
    plain = sealed.unseal(data, passphrase)
    try:
        bundle = msgspec.msgpack.decode(plain, type=BackupBundle)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise sealed.SealError(f"the backup opened, but this llmgw cannot read it: {e}") from None
    if bundle.format != BUNDLE_FORMAT:
        raise sealed.SealError(f"the backup's format is {bundle.format}; this llmgw reads "
                               f"{BUNDLE_FORMAT}")  # fmt: skip
    return bundle


def _passphrase(path: str) -> str:
    try:
        return sealed.read_passphrase(path)
    except (OSError, UnicodeDecodeError, sealed.SealError) as e:
        raise Refused(f"--passphrase-file {path}: {e}") from None


def describe(bundle: BackupBundle) -> str:
    """One line saying what a bundle holds."""
    when = datetime.datetime.fromtimestamp(bundle.made_at, datetime.UTC)
    return (
        f"cluster {bundle.cluster}, made {when:%Y-%m-%d %H:%M:%S} UTC on control plane "
        f"{bundle.plane} (llmgwd {bundle.version}, store schema {bundle.schema}, "
        f"{bundle.backend}, {bundle.keys} keys)"
    )


@click.command("backup")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@passphrase_option
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
@pass_settings
def backup(settings: Settings, file: Path, passphrase_file: str, force: bool) -> None:
    """Back the cluster up into FILE, sealed with a passphrase (admins only).

    FILE holds the store (SQLite's online backup on one control plane; on etcd every key at
    one revision), the cluster CA and its key, the cluster secret, the answering control
    plane's settings and the files they name (the OIDC client secret, the client port's
    certificate and key, LDAP's bind password: restored with their modes and owners),
    encrypted and authenticated (scrypt, AES-256-GCM): keep the passphrase apart from it.
    `llmgw restore FILE` brings the cluster back on a fresh host. Back up after every change
    of models, keys, people or settings, and daily for usage.
    """
    if file.exists() and not force:
        raise Refused(f"{file} exists: use --force to overwrite it")
    passphrase = _passphrase(passphrase_file)
    bundle = decoded(call(settings, "POST", f"{API}/backup"), BackupBundle)
    data = seal_bundle(bundle, passphrase)
    atomic.write(file, data)  # 0600, `sudo llmgw backup /tmp/x` follows no planted link
    click.echo(f"Backed up {describe(bundle)} to {file} ({len(data)} bytes).")


@click.command("restore")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@passphrase_option
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=config.SERVER_CONFIG,
    show_default=True,
    help="Where this host's server.yaml is written.",
)
@click.option("--no-start", is_flag=True, help="Write the state; do not start llmgwd.")
@pass_settings
def restore(
    settings: Settings, file: Path, passphrase_file: str, config_path: Path, no_start: bool
) -> None:
    """Bring the cluster of `llmgw backup`'s FILE back on this fresh host, as one control
    plane on SQLite, and start llmgwd.

    The same CA and secret: once this host answers at the address the nodes know (give it the
    old control plane's name or address), their agents reconnect and their engines are taken
    back as they run. A wrong passphrase, a changed file or a host that holds a control
    plane's state already is refused with nothing written. Grow it to etcd again with `llmgw
    plane migrate --to etcd` and `llmgw plane join`.
    """
    args = ["restore", str(file), "--passphrase-file", passphrase_file, "--config",
            str(config_path), "--socket", settings.socket]  # fmt: skip
    run_llmgwd([*args, "--no-start"] if no_start else args)  # llmgwd.planes.host_commands
