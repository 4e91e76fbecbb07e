"""`llmgw plane migrate --to etcd` on this host: refused when there is nothing to migrate, the
SQLite store copied into a real etcd member whole, state.db kept aside, server.yaml switched."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from llmgw import config
from llmgw.config import ServerConfig
from llmgwd.catalog import Catalog, Model
from llmgwd.planes import migrate_host
from llmgwd.store.etcd import EtcdStore
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.store import local_etcd

YAML = "# mine\nname: lab\nstate_dir: STATE\nnode_grace_s: 30\n"


def _cfg(tmp_path: Path, member: local_etcd.Member | None = None) -> ServerConfig:
    cfg = config.parse(YAML.replace("STATE", str(tmp_path)), ServerConfig)
    if member is None:
        return cfg
    store = config.StoreConfig(
        endpoint=member.endpoint,
        ca_file=str(member.ca_file),
        cert_file=str(member.cert_file),
        key_file=str(member.key_file),
    )
    return msgspec.structs.replace(cfg, store=store)  # fmt: skip


def test_nothing_to_migrate_is_refused(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    with pytest.raises(migrate_host.MigrationRefused, match="does not exist"):
        migrate_host.check(cfg, tmp_path)
    (tmp_path / "state.db").write_bytes(b"")
    assert migrate_host.check(cfg, tmp_path) == tmp_path / "state.db"
    with pytest.raises(migrate_host.MigrationRefused, match="is etcd already"):
        migrate_host.check(migrate_host.etcd_config(cfg), tmp_path)
    assert migrate_host.set_aside(tmp_path) == tmp_path / "state.db.before-etcd"
    (tmp_path / "state.db").write_bytes(b"")  # llmgwd started on SQLite again, say
    with pytest.raises(migrate_host.MigrationRefused, match="a migration was made here before"):
        migrate_host.check(cfg, tmp_path)


def test_server_yaml_switched_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(YAML)
    path.chmod(0o640)
    migrate_host.switch_config(path)
    cfg = config.load(path, ServerConfig)
    assert cfg.store.backend == "etcd" and cfg.node_grace_s == 30 and cfg.name == "lab"
    assert path.stat().st_mode & 0o777 == 0o640


@pytest.mark.skipif(not local_etcd.ETCD.exists(), reason="etcd is not installed")
async def test_sqlite_copied_into_the_member_and_set_aside(tmp_path: Path) -> None:
    source = await SqliteStore.open(tmp_path / "state.db")
    catalog = Catalog(source)
    await catalog.load()
    await catalog.add_model(Model(name="smol", source="file:/m.gguf", replicas=1))
    _, secret = await catalog.create_key("alice", "admin")
    await source.put("/usage/2026-12-03/k1/smol", b'{"requests":7}')
    await source.close()
    with local_etcd.cluster(tmp_path / "etcd") as [m]:
        copied = await migrate_host.copy(_cfg(tmp_path, m), tmp_path)
        backup = migrate_host.set_aside(tmp_path)
        assert not (tmp_path / "state.db").exists() and backup.exists()
        target = await EtcdStore.open(
            m.endpoint, ca_file=m.ca_file, cert_file=m.cert_file, key_file=m.key_file
        )
        again = Catalog(target)
        await again.load()
        assert again.get("smol") is not None and again.authenticate(secret) is not None
        usage = await target.get("/usage/2026-12-03/k1/smol")
        assert usage is not None and usage.value == b'{"requests":7}'
        assert copied.keys >= 3
        await target.close()
