"""A backup of an etcd store (every unleased key at one revision, copied into a SQLite file)
restored on a fresh host as one control plane: the key verifies, the usage is the same, the
leased keys (liveness, tokens) are left for their owners to make again."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw import pki
from llmgw.api_types import BackupBundle
from llmgw.config import ServerConfig, StoreConfig
from llmgwd.planes import backup
from llmgwd.store import prefix_end
from llmgwd.store.etcd import EtcdStore
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.store import local_etcd
from tests.llmgwd.test_backup import fill_store, restore, restored_state, sealed_backup


@pytest.fixture(scope="module")
def member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_etcd.Member]:
    if not local_etcd.ETCD.exists():
        pytest.skip("etcd is not installed (/usr/bin/etcd: apt install etcd-server)")
    with local_etcd.cluster(tmp_path_factory.mktemp("etcd")) as members:
        yield members[0]


async def backed_up(
    member: local_etcd.Member, ca: pki.CertKey, secret: bytes, file: Path
) -> tuple[BackupBundle, str, list[object]]:
    store = await EtcdStore.open(member.endpoint, ca_file=member.ca_file,
                                 cert_file=member.cert_file, key_file=member.key_file)  # fmt: skip
    try:
        await store.delete("", prefix_end(""))
        _, key, usage = await fill_store(store)
        lease = await store.lease_grant(30)
        await store.put("/servers/cp1", b"{}", lease=lease)
        cfg = ServerConfig(name="site", store=StoreConfig(backend="etcd"))
        bundle = await sealed_backup(backup.Source(store, cfg, ca, secret, "cp1"), file)
        return bundle, key, list(usage)
    finally:
        await store.close()


def test_an_etcd_clusters_backup_restores_as_one_plane(
    member: local_etcd.Member, tmp_path: Path
) -> None:
    ca, secret = pki.make_ca("site"), os.urandom(32)
    file = tmp_path / "cluster.backup"
    bundle, key, usage = asyncio.run(backed_up(member, ca, secret, file))
    assert (bundle.backend, bundle.cluster) == ("etcd", "site")
    fresh = tmp_path / "fresh"
    cfg = restore(file, fresh)
    assert cfg.store.backend == "sqlite"
    assert pki.read_pair(fresh / "pki/ca.pem", fresh / "pki/ca.key") == ca
    assert asyncio.run(restored_state(fresh, key)) == (True, usage)
    assert not asyncio.run(leased_left(fresh))


async def leased_left(state_dir: Path) -> bool:
    store = await SqliteStore.open(state_dir / "state.db")
    try:
        return await store.get("/servers/cp1") is not None
    finally:
        await store.close()
