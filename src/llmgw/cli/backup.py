"""llmgw backup FILE and llmgw restore FILE: the cluster's whole state sealed with a passphrase
(llmgw.sealed), and brought back on a fresh host by `llmgwd restore`."""

from __future__ import annotations

import contextlib
import datetime
import http.client
import io
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import msgspec

from llmgw import atomic, config, ipc, sealed
from llmgw import backup_archive as archive
from llmgw.api_types import BackupBundle
from llmgw.cli import https
from llmgw.cli.common import (
    API,
    NotFound,
    PinRefused,
    Refused,
    Settings,
    Unreachable,
    error_message,
    pass_settings,
)
from llmgw.cli.units import run_llmgwd

# An llmgwd 0.1 answers the BackupBundle's JSON whole (it holds its store in memory, so some
# 300 MB at most under its MemoryMax, 400 MB of base64): read whole, up to this.
MAX_JSON_ANSWER = 1 << 30

passphrase_option = click.option(
    "--passphrase-file",
    type=click.Path(exists=True, dir_okay=False),
    required=True,
    help="A file whose first line is the passphrase (12 characters at least).",
)


@dataclass(frozen=True, slots=True)
class Opened:
    """A backup file opened: its bundle, whose store copy_store() writes out."""

    bundle: BackupBundle  # its store empty: read by copy_store
    plain: sealed.Readable
    store_bytes: int

    def copy_store(self, sink: sealed.Writable) -> None:
        """The store into sink, a piece at a time, then the rest of the file verified:
        SealError (sink holds part of it then) if the file is damaged anywhere."""
        archive.copy_store(self.plain, self.store_bytes, sink)


def open_backup(source: sealed.Readable, passphrase: str) -> Opened:
    """A backup file (llmgw-sealed-2, or -1 of llmgw 0.1, opened whole) read up to its store;
    sealed.SealError when it cannot be opened or read."""
    plain = sealed.PlainReader(source, passphrase)
    if plain.peek(len(archive.MAGIC)) != archive.MAGIC:  # llmgw-sealed-1: the bundle whole
        bundle = archive.decode_bundle(plain.read())
        store = io.BytesIO(bundle.store)
        return Opened(msgspec.structs.replace(bundle, store=b""), store, len(bundle.store))
    bundle, store_bytes = archive.read_head(plain)
    return Opened(bundle, plain, store_bytes)


def _passphrase(path: str) -> str:
    """The passphrase file's passphrase; Refused, naming the file, if it is not one."""
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
    encrypted and authenticated a MiB at a time as it comes (scrypt, AES-256-GCM), FILE
    appearing only once whole: keep the passphrase apart from it.
    `llmgw restore FILE` brings the cluster back on a fresh host. Back up after every change
    of models, keys, people or settings, and daily for usage.
    """
    if file.exists() and not force:
        raise Refused(f"{file} exists: use --force to overwrite it")
    passphrase = _passphrase(passphrase_file)
    with _answer(settings) as body:
        try:
            # 0600 through a new file of a random name beside FILE, renamed once whole:
            # `sudo llmgw backup /tmp/x` follows no planted link, a cut leaves FILE as it was
            with atomic.writer(file) as out:
                bundle = _seal(body, sealed.Sealer(out, passphrase))
        except sealed.SealError as e:
            raise Refused(
                f"llmgwd's backup is not whole ({e}); nothing was written at {file}"
            ) from None
    click.echo(f"Backed up {describe(bundle)} to {file} ({file.stat().st_size} bytes).")


class _BrokenOff(Exception):
    """The answer's stream broke off."""


def _read(body: http.client.HTTPResponse, n: int) -> bytes:
    """Up to n bytes of the answer's body (b"" at its end); _BrokenOff if it broke off."""
    try:
        return body.read(n)
    except http.client.IncompleteRead:
        raise _BrokenOff("its answer ended before its last chunk") from None
    except (OSError, http.client.HTTPException) as e:
        raise _BrokenOff(str(e) or type(e).__name__) from None


class _Sealing:
    """The answer's body, read: each piece sealed as it is read."""

    def __init__(self, body: http.client.HTTPResponse, sealer: sealed.Sealer) -> None:
        self._body, self._sealer = body, sealer

    def read(self, n: int = -1, /) -> bytes:
        """Up to n bytes of the answer, sealed."""
        data = _read(self._body, n)
        self._sealer.write(data)
        return data


def _seal(body: http.client.HTTPResponse, sealer: sealed.Sealer) -> BackupBundle:
    """The answer sealed and checked whole (its bundle, its store to the announced length
    and its end) before the last chunk is sealed; its bundle (its store empty). A stream
    (`backup_archive`) is sealed as it comes; an llmgwd 0.1's JSON bundle, read whole, is
    sealed as the same stream, so that a file is of one format whichever llmgwd made it."""
    kind = body.headers.get_content_type()
    try:
        if kind == "application/json":
            bundle = _seal_json(body, sealer)
        elif kind == archive.MEDIA_TYPE:
            reading = _Sealing(body, sealer)
            bundle, store_bytes = archive.read_head(reading)
            archive.copy_store(reading, store_bytes, archive.Discard())
        else:
            raise archive.ArchiveError(f"llmgwd answered {kind}, not a backup")
    except _BrokenOff as e:
        raise Unreachable(f"llmgwd broke off the backup ({e}); nothing was written") from None
    sealer.close()
    return bundle


def _seal_json(body: http.client.HTTPResponse, sealer: sealed.Sealer) -> BackupBundle:
    """An llmgwd 0.1's answer, a BackupBundle's JSON (MAX_JSON_ANSWER at most), sealed as
    `backup_archive`'s stream; its bundle, its store empty."""
    data = bytearray()
    while piece := _read(body, archive.PIECE):
        data += piece
        if len(data) > MAX_JSON_ANSWER:
            raise archive.ArchiveError(f"its JSON answer is over {MAX_JSON_ANSWER >> 20} MiB")
    try:
        bundle = archive.readable(msgspec.json.decode(data, type=BackupBundle))
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise archive.ArchiveError(f"its JSON answer is not a backup: {e}") from None
    del data
    sealer.write(archive.head(bundle, len(bundle.store)))
    for at in range(0, len(bundle.store), archive.PIECE):  # not a copy of it all at once
        sealer.write(bundle.store[at : at + archive.PIECE])
    return msgspec.structs.replace(bundle, store=b"")


@contextlib.contextmanager
def _answer(settings: Settings) -> Iterator[http.client.HTTPResponse]:
    """POST /backup's answer, a stream (backup_archive) to read; an error answer refused."""
    remote, timeout = settings.remote(), max(settings.timeout, 600.0)
    headers = {"Accept": f"{archive.MEDIA_TYPE}, application/json"}
    headers |= https.auth_headers(remote) if remote else {}
    where = remote.url if remote else settings.socket
    try:
        conn: http.client.HTTPConnection = (
            https.connection(remote, timeout) if remote
            else ipc.UnixHTTPConnection(settings.socket, timeout)
        )  # fmt: skip
        conn.request("POST", f"{API}/backup", headers=headers)
        resp = conn.getresponse()
    except ssl.SSLCertVerificationError as e:
        raise PinRefused(
            f"the server at {where} is not the pinned one: {e.verify_message}"
        ) from None
    except (OSError, http.client.HTTPException) as e:
        why = getattr(e, "strerror", None) or e or type(e).__name__
        raise Unreachable(f"cannot reach llmgwd at {where}: {why}") from None
    try:
        if resp.status >= 400:
            raise _refusal(resp)
        yield resp
    finally:
        conn.close()


def _refusal(resp: http.client.HTTPResponse) -> click.ClickException:
    """An error answer as the CLI's refusal."""
    try:
        answer = msgspec.json.decode(resp.read())
    except (OSError, http.client.HTTPException, msgspec.DecodeError):
        answer = None
    message = error_message(answer, resp.status)
    return NotFound(message) if resp.status == 404 else Refused(message)


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
