"""Open the store server.yaml's `store:` section names: SQLite in the state dir, or etcd."""

from __future__ import annotations

from pathlib import Path

from llmgw.config import ServerConfig
from llmgwd.planes import etcd_member
from llmgwd.store import schema
from llmgwd.store.base import Store
from llmgwd.store.etcd import EtcdStore
from llmgwd.store.sqlite import SqliteStore

SQLITE_FILE = "state.db"


async def open_store(cfg: ServerConfig, state_dir: Path) -> Store:
    """The store of this control plane: STATE_DIR/state.db, or this host's etcd member with
    llmgwd's client certificate (STATE_DIR/pki/ unless the config names other files);
    schema.SchemaRefused when its schema is not one this llmgwd reads."""
    opened = await open_backend(cfg, state_dir)
    try:
        await schema.check(opened)
    except BaseException:
        await opened.close()
        raise
    return opened


async def open_backend(cfg: ServerConfig, state_dir: Path) -> Store:
    """The store server.yaml names, opened, its schema unchecked (a migration copies
    /schema with the rest into an empty store)."""
    store = cfg.store
    if store.backend == "sqlite":
        return await SqliteStore.open(state_dir / SQLITE_FILE)
    d = state_dir / "pki"
    return await EtcdStore.open(
        store.endpoint,
        ca_file=Path(store.ca_file) if store.ca_file else d / etcd_member.CA_CERT,
        cert_file=Path(store.cert_file) if store.cert_file else d / etcd_member.CLIENT_CERT,
        key_file=Path(store.key_file) if store.key_file else d / etcd_member.CLIENT_KEY,
    )
