"""open_store: server.yaml's `store:` section picks SQLite in the state dir or the etcd member."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw import config
from llmgw.config import ServerConfig
from llmgwd.planes import etcd_member
from llmgwd.store.etcd import EtcdStore
from llmgwd.store.open import open_store
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.store import local_etcd


def test_the_store_section_defaults_to_sqlite_and_checks_its_values() -> None:
    cfg = config.parse("name: x\n", ServerConfig)
    assert (cfg.store.backend, cfg.store.endpoint) == ("sqlite", "https://127.0.0.1:7720")
    with pytest.raises(config.ConfigError, match="backend"):
        config.parse("store:\n  backend: zookeeper\n", ServerConfig)
    with pytest.raises(config.ConfigError, match="endpoint"):
        config.parse("store:\n  backend: etcd\n  endpoint: http://127.0.0.1:7720\n", ServerConfig)


async def test_sqlite_is_the_state_dirs_file(tmp_path: Path) -> None:
    store = await open_store(ServerConfig(), tmp_path)
    try:
        assert isinstance(store, SqliteStore)
        await store.put("a", b"1")
    finally:
        await store.close()
    assert (tmp_path / "state.db").exists()


@pytest.fixture(scope="module")
def member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_etcd.Member]:
    if not local_etcd.ETCD.exists():
        pytest.skip("etcd is not installed (/usr/bin/etcd: apt install etcd-server)")
    with local_etcd.cluster(tmp_path_factory.mktemp("etcd")) as members:
        yield members[0]


async def test_etcd_uses_the_client_certificate_under_the_state_dirs_pki(
    member: local_etcd.Member,
) -> None:
    state_dir = member.pki_dir.parent  # the member's files are where llmgwd would find them
    assert member.cert_file == state_dir / "pki" / etcd_member.CLIENT_CERT
    text = f"store:\n  backend: etcd\n  endpoint: {member.endpoint}/\n"
    store = await open_store(config.parse(text, ServerConfig), state_dir)
    try:
        assert isinstance(store, EtcdStore)
        rev = await store.put("opened", b"yes")
        assert (await store.get("opened")) is not None
        assert rev == await store.revision()
    finally:
        await store.close()
