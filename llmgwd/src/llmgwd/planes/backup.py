"""A control plane's whole state in one bundle (the store, the cluster CA and secret, the
settings and the files they name) and its restore on a fresh host as a one-plane cluster on
SQLite."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from llmgw import config, package_version, pki
from llmgw.api_types import BackupBundle
from llmgw.config import ServerConfig
from llmgwd.planes import etcd_member, migrate, site_files
from llmgwd.store import Store, schema
from llmgwd.store.open import SQLITE_FILE
from llmgwd.store.sqlite import SqliteStore

log = logging.getLogger(__name__)

SECRET_FILE = "secret"  # noqa: S105 (a file name: the cluster secret, daemon.load_secret)


class BackupFailed(Exception):
    """No backup could be made; the message says why."""


class RestoreRefused(Exception):
    """The bundle cannot be restored here; the message says why (nothing was written)."""


@dataclass(frozen=True, slots=True)
class Source:
    """What a backup is made of, on the control plane that makes it."""

    store: Store
    cfg: ServerConfig
    ca: pki.CertKey
    secret: bytes
    plane: str  # this control plane's name


@dataclass(slots=True)
class Dump:
    """A backup made: its bundle (its store left empty) and the store file to stream, open,
    its name already gone from the disk (a crash leaves nothing to clean)."""

    bundle: BackupBundle
    store: BinaryIO
    store_bytes: int


def _spool_dir(cfg: ServerConfig) -> Path:
    """Where the store's copy is made: the state dir (on disk, llmgwd's own), or the
    temporary dir where there is none (a test's settings)."""
    state = Path(cfg.state_dir)
    return state if state.is_dir() and os.access(state, os.W_OK) else Path(tempfile.gettempdir())


def _remove(path: Path) -> None:
    """path and the journals SQLite may have left beside it, those there."""
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")):
        p.unlink(missing_ok=True)


def _fresh_private(path: Path) -> None:
    """path empty and 0600 (SQLite gives its journals the same mode), none left before."""
    _remove(path)  # left by a crash
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))


async def _store_copy(store: Store, path: Path) -> int:
    """The store copied into a new state.db file at path, page by page (no copy held in
    memory): SQLite's online backup, or (etcd) every unleased key at one revision, read in
    pages, written into a SQLite store there; its keys."""
    if isinstance(store, SqliteStore):
        return await store.snapshot_to(path)
    copy = await SqliteStore.open(path)
    try:
        done = await migrate.copy(store, copy)
        return done.keys
    finally:
        await copy.close()


@contextlib.asynccontextmanager
async def dump(src: Source) -> AsyncIterator[Dump]:
    """The backup `llmgw restore` brings the cluster back from, its store in a file made
    beside the store (one at a time: api/backup.py), removed when the block ends."""
    started = time.monotonic()
    try:
        files = await asyncio.to_thread(site_files.read, src.cfg)  # NSS may block
    except site_files.SiteFileError as e:
        raise BackupFailed(str(e)) from None
    path = _spool_dir(src.cfg) / f".{SQLITE_FILE}.backup"
    try:
        await asyncio.to_thread(_fresh_private, path)
        keys = await _store_copy(src.store, path)
        f = await asyncio.to_thread(open, path, "rb")
    finally:
        await asyncio.to_thread(_remove, path)
    with f:
        size = os.fstat(f.fileno()).st_size
        found = await schema.stored(src.store)
        bundle = BackupBundle(
            made_at=time.time(), cluster=src.cfg.name, plane=src.plane,
            version=package_version(), schema=found[0].schema if found else schema.SCHEMA,
            backend=src.cfg.store.backend, keys=keys, store=b"",
            ca_cert_pem=src.ca.cert_pem.decode(), ca_key_pem=src.ca.key_pem.decode(),
            secret=src.secret, settings=config.dump(src.cfg), files=files,
        )  # fmt: skip
        log.info("backup made: %d keys, %d bytes of store, %d named files, in %.2f s", keys,
                 size, len(files), time.monotonic() - started)  # fmt: skip
        yield Dump(bundle, f, size)


def restored_config(bundle: BackupBundle, state_dir: Path | None) -> ServerConfig:
    """The bundle's settings for this host: one control plane on SQLite, in state_dir (None:
    the state dir the settings name)."""
    try:
        cfg = config.parse(bundle.settings, ServerConfig, "the backup's settings")
    except config.ConfigError as e:
        raise RestoreRefused(f"this llmgwd cannot read the backup's settings: {e}") from None
    cfg.state_dir = str(state_dir) if state_dir is not None else cfg.state_dir
    cfg.store = config.StoreConfig()  # SQLite: an etcd cluster is grown again from it
    return cfg


def _check_fresh(state_dir: Path, config_path: Path) -> None:
    """RestoreRefused when this host holds a control plane's state or settings already."""
    for held in (config_path, state_dir / SQLITE_FILE, state_dir / "pki" / etcd_member.CA_CERT):
        if held.exists():
            raise RestoreRefused(
                f"{held} exists: restore on a fresh host (or move this host's {held.name} "
                "away first); nothing was written"
            )


async def _check_store(path: Path) -> None:
    """Open the restored store file as llmgwd will: its schema must be one this llmgwd reads."""
    try:
        store = await SqliteStore.open(path)
    except Exception as e:
        raise RestoreRefused(f"the backup's store cannot be opened: {e}") from None
    try:
        await schema.check(store)
    except schema.SchemaRefused as e:
        raise RestoreRefused(f"{e}; nothing was written") from None
    finally:
        await store.close()


def _left_by_failure(
    state_dir: Path, config_path: Path, named: list[site_files.Planned]
) -> list[Path]:
    """What a restore failing midway must remove: what it writes that is not here now (a
    named file there already has the backup's bytes and stays) and its temporary files."""
    d, staged = state_dir / "pki", state_dir / f".{SQLITE_FILE}.restoring"
    written = [d / etcd_member.CA_CERT, d / etcd_member.CA_KEY, state_dir / SECRET_FILE,
               config_path, *(Path(p.file.path) for p in named)]  # fmt: skip
    temporary = [staged, Path(f"{staged}-wal"), Path(f"{staged}-shm")]
    return [p for p in written if not p.exists()] + temporary


def restore(
    bundle: BackupBundle,
    state_dir: Path | None,
    config_path: Path,
    owner: tuple[int, int] | None,
    store: Callable[[BinaryIO], None] | None = None,
) -> ServerConfig:
    """Write the bundle's store, CA, secret and settings for a control plane on this fresh
    host (in state_dir, None: the settings'; owned by owner, uid and gid, where given), and
    the files the settings name with their modes and owners; its settings. The store is
    staged first, by store (a backup file's, read to its end: `Opened.copy_store`) or from
    the bundle's bytes; nothing else is written unless it was whole. RestoreRefused, with
    nothing written, when the host is not fresh or this llmgwd cannot run the store; any
    other failure midway removes what was written, so the restore can be tried again."""
    cfg = restored_config(bundle, state_dir)
    state_dir = Path(cfg.state_dir)
    _check_fresh(state_dir, config_path)
    try:
        named = site_files.plan(bundle.files)
    except site_files.SiteFileError as e:
        raise RestoreRefused(f"{e}; nothing was written") from None
    state_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
    undo = _left_by_failure(state_dir, config_path, named)
    staged = state_dir / f".{SQLITE_FILE}.restoring"
    try:
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            if store is None:
                f.write(bundle.store)
            else:
                store(f)  # a damaged file raises here: only the staged store is undone
            f.flush()
            os.fsync(f.fileno())
        asyncio.run(_check_store(staged))
        _write_keys(bundle, state_dir)
        site_files.write(named)
        gid = owner[1] if owner is not None else None
        config.write_server(config_path, cfg, "restored by `llmgw restore`", gid)
        os.replace(staged, state_dir / SQLITE_FILE)
    except BaseException:
        for path in undo:
            with contextlib.suppress(OSError):  # not there: never written
                path.unlink()
        raise
    if owner is not None:
        _chown(state_dir, owner)
    return cfg


def _write_keys(bundle: BackupBundle, state_dir: Path) -> None:
    """The cluster CA, its key and the secret written under state_dir, private."""
    d = state_dir / "pki"
    d.mkdir(mode=0o700, exist_ok=True)
    ca = pki.CertKey(bundle.ca_cert_pem.encode(), bundle.ca_key_pem.encode())
    pki.write_pair(ca, d / etcd_member.CA_CERT, d / etcd_member.CA_KEY)
    pki.write_pem(state_dir / SECRET_FILE, bundle.secret, private=True)


def _chown(state_dir: Path, owner: tuple[int, int]) -> None:
    """The restored files to llmgwd's user, as the package's own are."""
    for p in (state_dir, state_dir / "pki", *state_dir.joinpath("pki").iterdir()):
        os.chown(p, *owner)
    for name in (SQLITE_FILE, SECRET_FILE):
        os.chown(state_dir / name, *owner)
