"""llmgw.blobstore: published files checked and whole, refused ones kept, sizes as du sees them."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from llmgw import blobstore
from llmgw.blobstore import BlobStore, BlobStoreError, ChecksumMismatch, git_blob_id_file
from llmgw.wire import HeldFile


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def du_files(path: Path) -> int:
    """`du -sb` of a directory, less the directory's own entry."""
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, check=True, text=True)
    return int(out.stdout.split()[0]) - path.stat().st_size


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "store")


def test_the_store_is_readable_by_engines_running_as_other_users(store: BlobStore) -> None:
    for d in (store.blobs, store.partials):
        assert d.stat().st_mode & 0o777 == 0o755


def test_names_are_sha256s(store: BlobStore) -> None:
    with pytest.raises(ValueError):
        store.path("../etc/passwd")
    with pytest.raises(ValueError):
        store.path("A" * 64)
    with pytest.raises(ValueError):
        store.partial("../x")
    assert store.partial("git-" + "a" * 40).name == "git-" + "a" * 40 + ".part"


def test_ingest_copies_checks_and_publishes(store: BlobStore, tmp_path: Path) -> None:
    src = tmp_path / "model.gguf"
    data = os.urandom(3_000_000)
    src.write_bytes(data)

    held = store.ingest(src, expect_sha256=sha(data), expect_git_oid=git_blob_id_file(src))

    assert held == HeldFile(sha256=sha(data), size=len(data))
    assert store.has(sha(data)) and store.size(sha(data)) == len(data)
    assert store.path(sha(data)).read_bytes() == data
    assert store.path(sha(data)).stat().st_mode & 0o777 == 0o644
    assert store.held() == [held]
    assert os.listdir(store.partials) == []
    # Without expectations it is published under what it hashes to.
    other = tmp_path / "other"
    other.write_bytes(b"hello")
    assert store.ingest(other) == HeldFile(sha256=sha(b"hello"), size=5)


def test_a_file_that_does_not_check_is_refused_and_kept(store: BlobStore, tmp_path: Path) -> None:
    src = tmp_path / "model.gguf"
    src.write_bytes(b"these are not the bytes")
    expected = sha(b"the bytes")

    with pytest.raises(ChecksumMismatch) as e:
        store.ingest(src, expect_sha256=expected)
    assert expected in str(e.value) and sha(src.read_bytes()) in str(e.value)
    assert store.held() == [] and os.listdir(store.blobs) == []
    with pytest.raises(ChecksumMismatch):
        store.ingest(src, expect_sha256=expected)
    assert [p.read_bytes() for p in store.refused()] == [src.read_bytes()] * 2

    # Only an explicit removal deletes them.
    assert store.remove_partials(keep=set()) == 2 * src.stat().st_size
    assert store.refused() == []


def test_publish_of_a_blob_already_there_drops_the_partial(store: BlobStore) -> None:
    data = b"same bytes"
    for _ in range(2):
        part = store.partial(sha(data))
        part.write_bytes(data)
        store.publish(part, sha(data))
        assert not part.exists()
    assert store.path(sha(data)).read_bytes() == data


def test_held_usage_and_remove_agree_with_du(store: BlobStore, tmp_path: Path) -> None:
    sizes = [1, 4095, 4097, 1 << 20]
    for n in sizes:
        src = tmp_path / f"f{n}"
        src.write_bytes(os.urandom(n))
        store.ingest(src)
    (store.blobs / "README").write_text("not a blob")
    os.remove(store.blobs / "README")
    (store.blobs / ("0" * 63)).write_bytes(b"not a blob name")

    assert sorted(f.size for f in store.held()) == sizes
    assert store.usage() == sum(sizes) == du_files(store.blobs) - len(b"not a blob name")

    before = du_files(store.blobs)
    victim = max(store.held(), key=lambda f: f.size)
    assert store.remove(victim.sha256) == victim.size == before - du_files(store.blobs)
    assert store.remove(victim.sha256) == 0
    assert store.usage() == sum(sizes[:-1])


def test_one_writer_per_partial(store: BlobStore) -> None:
    key = "a" * 64
    with store.writer(key, 10), pytest.raises(BlobStoreError, match="being written"):
        store.writer(key, 10)
    store.writer(key, 10).close()


def test_a_partial_is_resumed_in_steps_and_checks_as_a_whole(store: BlobStore) -> None:
    data = os.urandom(5_000_000)
    key = sha(data)
    store.partial(key).write_bytes(data[:3_500_000])

    with store.writer(key, len(data), git_oid=True) as w:
        steps = 1
        while not w.resume(1_000_000):
            steps += 1
        assert (steps, w.done) == (4, 3_500_000)
        w.write(data[3_500_000:])
        assert w.sha256() == sha(data)
        assert w.git_oid() == blobstore.git_blob_id(data)
    # A partial longer than the file is dropped, not trusted.
    store.partial(key).write_bytes(data + b"more")
    with store.writer(key, len(data)) as w:
        assert w.resume() and w.done == 0 and w.on_disk() == 0
        assert w.git_oid() == ""  # not asked for: not computed
