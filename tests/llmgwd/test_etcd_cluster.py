"""The control planes' etcd membership and the migration against real etcd members: members
listed, health seen, a dead member removed, and a SQLite store copied into etcd whole."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llmgw import pki
from llmgwd.catalog import Catalog, Model
from llmgwd.planes import etcd_member, migrate
from llmgwd.planes.etcd_cluster import EtcdCluster
from llmgwd.store import prefix_end
from llmgwd.store.etcd import EtcdStore
from llmgwd.store.etcd_http import EtcdHttp, tls_context
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.store import local_etcd

pytestmark = pytest.mark.skipif(not local_etcd.ETCD.exists(), reason="etcd is not installed")


def _client(m: local_etcd.Member) -> tuple[EtcdCluster, EtcdHttp]:
    tls = tls_context(m.ca_file, m.cert_file, m.key_file)
    http = EtcdHttp(m.endpoint, tls)
    return EtcdCluster(http, tls), http


async def _until(etcd: EtcdCluster, ok: Callable[[dict[int, bool]], bool]) -> bool:
    """Whether ok(health) holds within 30 s (etcd notices a dead peer in a second or two)."""
    for _ in range(150):
        if ok(await etcd.healthy()):
            return True
        await asyncio.sleep(0.2)
    return False


@pytest.fixture
def three(tmp_path: Path) -> Iterator[list[local_etcd.Member]]:
    with local_etcd.cluster(tmp_path, 3) as members:
        yield members


async def test_members_health_and_a_dead_one_removed(three: list[local_etcd.Member]) -> None:
    etcd, http = _client(three[0])
    members = await etcd.members()
    assert sorted(m.name for m in members) == ["m0", "m1", "m2"]
    assert await _until(etcd, lambda h: sorted(h.values()) == [True] * 3)
    three[2].proc.kill()
    three[2].proc.wait()
    m2 = next(m for m in members if m.name == "m2")
    assert await _until(etcd, lambda h: h.get(m2.id) is False)
    await etcd.remove(m2.id)
    assert sorted(m.name for m in await etcd.members()) == ["m0", "m1"]
    await http.close()


async def test_sqlite_migrated_into_etcd_whole(tmp_path: Path) -> None:
    source = await SqliteStore.open(tmp_path / "state.db")
    catalog = Catalog(source)
    await catalog.load()
    await catalog.add_model(Model(name="smol", source="file:/m.gguf", replicas=1))
    _, secret = await catalog.create_key("alice", "admin")
    for i in range(300):
        await source.put(f"/usage/2026-12-0{i % 9}/k{i}/smol", b'{"requests":%d}' % i)
    with local_etcd.cluster(tmp_path / "etcd") as [m]:
        target = await EtcdStore.open(
            m.endpoint, ca_file=m.ca_file, cert_file=m.cert_file, key_file=m.key_file
        )
        done = await migrate.copy(source, target)
        want, _ = await source.range("", prefix_end(""))
        got, _ = await target.range("", prefix_end(""))
        assert done.keys == len(want) == len(got) == 302
        assert [(kv.key, kv.value) for kv in got] == [(kv.key, kv.value) for kv in want]
        again = Catalog(target)
        await again.load()
        assert again.authenticate(secret) is not None and again.get("smol") is not None
        with pytest.raises(migrate.MigrateError, match="not empty"):
            await migrate.copy(source, target)
        await target.close()
    await source.close()


def _start_joined(
    m0: local_etcd.Member, root: Path, peers: dict[str, str]
) -> subprocess.Popen[bytes]:
    """A second member, as `llmgw plane join` starts it: the CA copied, state existing."""
    pki_dir = root / "pki"
    ca = pki.read_pair(m0.ca_file, m0.pki_dir / etcd_member.CA_KEY)
    pki.write_pair(ca, pki_dir / etcd_member.CA_CERT, pki_dir / etcd_member.CA_KEY)
    etcd_member.ensure_certs(pki_dir, "m1", "127.0.0.1")
    client, peer = local_etcd._free_ports(1)[0], int(peers["m1"].rsplit(":", 1)[1])
    etcd_member.write_member_config(
        root / "etcd.yaml", name="m1", advertise_ip="127.0.0.1", initial_cluster=peers,
        state="existing", state_dir=root, client_port=client, peer_port=peer, election_ms=500,
    )  # fmt: skip
    log = (root / "etcd.log").open("wb")
    argv = [str(local_etcd.ETCD), "--config-file", str(root / "etcd.yaml")]
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


async def test_a_joined_member_is_a_learner_until_caught_up(tmp_path: Path) -> None:
    with local_etcd.cluster(tmp_path / "m0") as [m0]:
        etcd, http = _client(m0)
        peer = etcd_member.peer_url("127.0.0.1", local_etcd._free_ports(1)[0])
        after = await etcd.add(peer)
        [learner] = [m for m in after if m.learner]
        assert learner.name == "" and learner.peer_urls == [peer]
        # Not started: no vote, so the one member keeps its quorum and takes writes.
        assert not await etcd.promote(learner.id)
        store = await EtcdStore.open(
            m0.endpoint, ca_file=m0.ca_file, cert_file=m0.cert_file, key_file=m0.key_file
        )
        await store.put("/still", b"writable")
        [voter] = [m for m in after if not m.learner]
        proc = _start_joined(m0, tmp_path / "m1", {"m0": voter.peer_urls[0], "m1": peer})
        try:
            promoted = False
            for _ in range(150):
                if promoted := await etcd.promote(learner.id):
                    break
                await asyncio.sleep(0.2)
            assert promoted
            members = await etcd.members()
            assert sorted(m.name for m in members) == ["m0", "m1"]
            assert not any(m.learner for m in members)
        finally:
            proc.terminate()
            proc.wait(10)
        await store.close()
        await http.close()
