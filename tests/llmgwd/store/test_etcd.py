"""EtcdStore: the conformance suite against a real etcd member (TLS, client certificates), then
what only the etcd backend does: compaction, a cut watch, refused certificates."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from llmgw import pki
from llmgwd.store.base import CompactedError, Put, Store, prefix_end
from llmgwd.store.etcd import EtcdStore
from llmgwd.store.etcd_http import EtcdUnavailable
from tests.llmgwd.store import local_etcd
from tests.llmgwd.store.conformance import StoreConformance, summary, take

pytestmark = pytest.mark.skipif(
    not local_etcd.ETCD.exists(),
    reason="etcd is not installed (/usr/bin/etcd: apt install etcd-server)",
)


@pytest.fixture(scope="module")
def member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_etcd.Member]:
    with local_etcd.cluster(tmp_path_factory.mktemp("etcd")) as members:
        yield members[0]


async def open_store(member: local_etcd.Member) -> EtcdStore:
    return await EtcdStore.open(
        member.endpoint,
        ca_file=member.ca_file,
        cert_file=member.cert_file,
        key_file=member.key_file,
    )


@pytest.fixture
async def store(member: local_etcd.Member) -> AsyncIterator[Store]:
    """A store on the module's member, emptied first: no key, no lease from an earlier test."""
    opened = await open_store(member)
    await opened.delete("", prefix_end(""))
    for lease in await opened.leases():
        await opened.lease_revoke(lease)
    yield opened
    await opened.close()


class TestEtcdConformance(StoreConformance):
    lease_ttl_s = 1.0  # etcd's leases are whole seconds (the test member's smallest is 1 s)


async def test_compacted_history_is_refused_for_reads_and_watches(store: EtcdStore) -> None:
    old = await store.put("k", b"1")
    now = await store.put("k", b"2")
    await store.compact(now)
    with pytest.raises(CompactedError):
        await store.range("k", revision=old)
    with pytest.raises(CompactedError):
        await anext(store.watch("k", start_revision=old))
    kept = await take(store.watch("k", start_revision=now), 1)
    assert summary(kept) == [("put", "k", b"2", now)]


class CuttingProxy:
    """A TCP proxy to the member whose connections can all be cut at once."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.server = server
        return int(server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()


async def test_a_cut_watch_resumes_after_the_last_revision_seen(
    member: local_etcd.Member, store: EtcdStore
) -> None:
    proxy = CuttingProxy(int(member.endpoint.rsplit(":", 1)[1]))
    port = await proxy.start()
    via = await EtcdStore.open(
        f"https://127.0.0.1:{port}",
        ca_file=member.ca_file,
        cert_file=member.cert_file,
        key_file=member.key_file,
    )
    try:
        start = await store.revision()
        events = via.watch("w/", prefix_end("w/"), start_revision=start + 1)
        r1 = await store.put("w/1", b"1")
        assert summary(await take(events, 1)) == [("put", "w/1", b"1", r1)]
        proxy.cut()  # as a broken connection or a restarted member would
        r2 = await store.put("w/2", b"2")
        r3 = await store.put("w/3", b"3")
        assert summary(await take(events, 2)) == [
            ("put", "w/2", b"2", r2),
            ("put", "w/3", b"3", r3),
        ]
    finally:
        await via.close()
        proxy.server.close()


async def test_a_client_without_a_cluster_certificate_is_refused(
    member: local_etcd.Member, tmp_path: Path
) -> None:
    stranger = pki.make_ca("stranger")
    pair = pki.make_etcd_cert(stranger, "intruder")
    pki.write_pair(pair, tmp_path / "c.pem", tmp_path / "c.key")
    with pytest.raises(EtcdUnavailable):
        await EtcdStore.open(
            member.endpoint,
            ca_file=member.ca_file,
            cert_file=tmp_path / "c.pem",
            key_file=tmp_path / "c.key",
            wait_s=0,
        )


async def test_a_closed_store_refuses_work(member: local_etcd.Member) -> None:
    store = await open_store(member)
    await store.close()
    with pytest.raises(RuntimeError, match="closed"):
        await store.get("a")
    with pytest.raises(RuntimeError, match="closed"):
        store.watch("a")


async def test_many_watches_and_writes_at_once(store: EtcdStore) -> None:
    start = await store.revision()
    watches = [store.watch("m/", prefix_end("m/"), start_revision=start + 1) for _ in range(30)]
    revs = await asyncio.gather(*(store.put(f"m/{i}", b"x") for i in range(30)))
    for events in watches:
        assert [e.kv.mod_revision for e in await take(events, 30)] == sorted(revs)


async def test_a_large_txn_and_value_fit_as_on_sqlite(store: EtcdStore) -> None:
    """The member takes what the SQLite store takes in one write, near enough: 1000 puts in
    one txn (etcd's default allows 128) and a 4 MiB value (its default, 1.5 MiB)."""
    result = await store.txn([], [Put(f"big/{i:04}", b"x") for i in range(1000)])
    kvs, _ = await store.range("big/", prefix_end("big/"))
    assert len(kvs) == 1000 and {kv.mod_revision for kv in kvs} == {result.revision}
    value = bytes(range(256)) * (4 * 4096)
    await store.put("huge", value)
    kv = await store.get("huge")
    assert kv is not None and kv.value == value
