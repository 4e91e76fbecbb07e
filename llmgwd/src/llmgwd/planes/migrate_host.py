"""This host's side of `llmgw plane migrate --to etcd`: the first member's config, SQLite
copied into it, state.db set aside as the backup, and server.yaml switched to etcd."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec
import yaml

from llmgw import config
from llmgw.config import ServerConfig
from llmgwd.planes import etcd_member, migrate
from llmgwd.store.open import SQLITE_FILE, open_backend
from llmgwd.store.sqlite import SqliteStore

BACKUP_SUFFIX = ".before-etcd"  # state.db.before-etcd: the SQLite store as it was copied
OPEN_WAIT_S = 60.0  # the new member starting


class MigrationRefused(Exception):
    """The migration cannot be made here; the message says why."""


def backup_path(state_dir: Path) -> Path:
    """Where state.db is kept once copied."""
    return state_dir / (SQLITE_FILE + BACKUP_SUFFIX)


def check(cfg: ServerConfig, state_dir: Path) -> Path:
    """The SQLite file to copy; MigrationRefused when this control plane is on etcd already
    or its store is not there."""
    if cfg.store.backend == "etcd":
        raise MigrationRefused(
            "this control plane's store is etcd already (server.yaml's store.backend): "
            "there is nothing to migrate"
        )
    if backup_path(state_dir).exists():
        raise MigrationRefused(
            f"{backup_path(state_dir)} exists: a migration was made here before; move it away "
            "to migrate again"
        )
    db = state_dir / SQLITE_FILE
    if not db.exists():
        raise MigrationRefused(f"{db} does not exist: this host has no store to migrate")
    return db


def write_first_member(config_path: Path, state_dir: Path, name: str, ip: str) -> None:
    """This host's etcd certificates and the config of the first member of a new cluster."""
    etcd_member.ensure_certs(state_dir / "pki", name, ip)
    etcd_member.write_member_config(
        config_path, name=name, advertise_ip=ip, initial_cluster={name: etcd_member.peer_url(ip)},
        state="new", state_dir=state_dir,
    )  # fmt: skip


def etcd_config(cfg: ServerConfig) -> ServerConfig:
    """cfg with its store on this host's etcd member."""
    return msgspec.structs.replace(cfg, store=msgspec.structs.replace(cfg.store, backend="etcd"))


async def copy(cfg: ServerConfig, state_dir: Path) -> migrate.Copied:
    """Every key of state.db copied into the member and read back; state.db's files keep
    their owner (this runs as root, llmgwd as llmgw)."""
    db = state_dir / SQLITE_FILE
    owner = db.stat()
    source = await SqliteStore.open(db)
    try:
        target = await open_backend(etcd_config(cfg), state_dir)
        try:
            return await migrate.copy(source, target)
        finally:
            await target.close()
    finally:
        await source.close()
        _keep_owner(state_dir, owner.st_uid, owner.st_gid)


def _keep_owner(state_dir: Path, uid: int, gid: int) -> None:
    """state.db's files (the -wal and -shm root may have made) owned as state.db is."""
    for f in state_dir.glob(SQLITE_FILE + "*"):
        if os.geteuid() == 0 and f.is_file():
            os.chown(f, uid, gid)


def set_aside(state_dir: Path) -> Path:
    """state.db (and its -wal and -shm) renamed to state.db.before-etcd*: the backup."""
    backup = backup_path(state_dir)
    for f in sorted(state_dir.glob(SQLITE_FILE + "*")):
        if f.name.startswith(backup.name):
            continue
        f.rename(state_dir / (backup.name + f.name.removeprefix(SQLITE_FILE)))
    return backup


def switch_config(path: Path) -> None:
    """server.yaml's store.backend set to etcd, the rest as it was (comments aside)."""
    text = path.read_text()
    data = yaml.safe_load(text) or {}
    data.setdefault("store", {})["backend"] = "etcd"
    header = f"# llmgwd's configuration; store moved to etcd by `llmgw plane migrate` {_now()}.\n"
    new = header + yaml.safe_dump(data, sort_keys=False)
    config.parse(new, ServerConfig, str(path))  # still a valid server.yaml
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new)
    os.chmod(tmp, path.stat().st_mode & 0o777)
    os.replace(tmp, path)


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")
