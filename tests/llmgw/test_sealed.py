"""A sealed backup file: opened only with its passphrase, whole; another file, a damaged
header or a changed byte refused, and a short passphrase refused before anything is sealed."""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from llmgw import sealed

PHRASE = "correct horse battery staple"


@pytest.fixture(scope="module")
def box() -> bytes:
    return sealed.seal(b"the cluster's state", PHRASE, log2_n=10)


def test_the_passphrase_opens_what_was_sealed_and_nothing_else(box: bytes) -> None:
    assert sealed.unseal(box, PHRASE) == b"the cluster's state"
    assert b"the cluster's state" not in box
    with pytest.raises(sealed.SealError, match="wrong passphrase"):
        sealed.unseal(box, PHRASE + "!")


@pytest.mark.parametrize("at", [20, -1], ids=["in-the-header", "in-the-text"])
def test_a_changed_byte_is_refused(box: bytes, at: int) -> None:
    changed = bytearray(box)
    changed[at] ^= 0x40
    with pytest.raises(sealed.SealError):
        sealed.unseal(bytes(changed), PHRASE)


def test_another_file_and_a_damaged_cost_are_refused(box: bytes) -> None:
    with pytest.raises(sealed.SealError, match="not an llmgw backup"):
        sealed.unseal(b"SQLite format 3\0" + bytes(100), PHRASE)
    huge = bytearray(box)
    huge[len(sealed.MAGIC)] = 40  # scrypt's N = 2**40: never derived
    with pytest.raises(sealed.SealError, match="out of range"):
        sealed.unseal(bytes(huge), PHRASE)


@pytest.mark.parametrize(
    ("log2_n", "r", "p"), [(22, 64, 1), (22, 8, 2), (20, 8, 16)], ids=["32GiB", "r-p", "p"]
)
def test_a_header_asking_scrypt_for_over_4_gib_is_refused_before_deriving(
    box: bytes, monkeypatch: pytest.MonkeyPatch, log2_n: int, r: int, p: int
) -> None:
    def derive(*_: object) -> bytes:
        raise AssertionError("scrypt was asked")

    monkeypatch.setattr(sealed, "_key", derive)
    crafted = bytearray(box)
    struct.pack_into(">BII", crafted, len(sealed.MAGIC), log2_n, r, p)
    with pytest.raises(
        sealed.SealError, match=rf"asks scrypt for N=2\^{log2_n}, r={r}, p={p}: over the 4 GiB"
    ):
        sealed.unseal(bytes(crafted), PHRASE)


def test_our_own_cost_is_within_the_bound() -> None:
    assert 128 * (1 << sealed.LOG2_N) * sealed.R * sealed.P <= sealed.MAX_SCRYPT_BYTES


def test_a_short_passphrase_is_refused(tmp_path: Path) -> None:
    with pytest.raises(sealed.SealError, match="shorter than 12"):
        sealed.seal(b"x", "short")
    f = tmp_path / "phrase"
    f.write_text(PHRASE + "\nsecond line ignored\n")
    assert sealed.read_passphrase(str(f)) == PHRASE
    f.write_text("short\n")
    with pytest.raises(sealed.SealError, match="shorter than 12"):
        sealed.read_passphrase(str(f))


# llmgw-sealed-2: chunk by chunk (STREAM); what a cut, a reorder or an append looks like

SMALL = 64  # plaintext bytes a chunk, so that a few hundred bytes make several chunks
TEXT = bytes(range(256)) * 2 + b"the end"  # 519 bytes: 8 full chunks and a short last one


@pytest.fixture(scope="module")
def chunked() -> bytes:
    return sealed.seal(TEXT, PHRASE, log2_n=10, chunk=SMALL)


def _chunks(box: bytes) -> tuple[bytes, list[bytes]]:
    """A sealed-2 file's header and its chunks as written."""
    body, size = box[sealed.HEADER_BYTES :], SMALL + sealed.TAG_BYTES
    return box[: sealed.HEADER_BYTES], [body[i : i + size] for i in range(0, len(body), size)]


def test_a_file_of_many_chunks_opens_a_chunk_at_a_time(chunked: bytes) -> None:
    header, chunks = _chunks(chunked)
    assert header.startswith(b"llmgw-sealed-2\n") and len(chunks) == 9
    got = list(sealed.opened(io.BytesIO(chunked), PHRASE))
    assert [len(c) for c in got] == [SMALL] * 8 + [7] and b"".join(got) == TEXT
    reader = sealed.PlainReader(io.BytesIO(chunked), PHRASE)
    pieces = iter(lambda: reader.read(10), b"")
    assert b"".join(pieces) == TEXT


@pytest.mark.parametrize("size", [0, 1, SMALL, 3 * SMALL, 3 * SMALL + 1])
def test_any_length_comes_back_whole(size: int) -> None:
    text = os.urandom(size)
    assert sealed.unseal(sealed.seal(text, PHRASE, log2_n=10, chunk=SMALL), PHRASE) == text


def test_a_wrong_passphrase_is_refused_at_the_first_chunk(chunked: bytes) -> None:
    chunks = sealed.opened(io.BytesIO(chunked), PHRASE + "!")
    with pytest.raises(sealed.SealError, match="wrong passphrase"):
        next(chunks)


@pytest.mark.parametrize("n", range(9))
def test_a_byte_changed_in_any_chunk_is_refused(chunked: bytes, n: int) -> None:
    header, chunks = _chunks(chunked)
    changed = bytearray(chunks[n])
    changed[len(changed) // 2] ^= 1
    chunks[n] = bytes(changed)
    with pytest.raises(sealed.SealError, match="changed since it was made"):
        sealed.unseal(header + b"".join(chunks), PHRASE)


def _moved(chunks: list[bytes], how: str) -> list[bytes]:
    if how == "dropped":
        return chunks[:3] + chunks[4:]
    if how == "swapped":
        return [*chunks[:3], chunks[4], chunks[3], *chunks[5:]]
    if how == "repeated":
        return [*chunks[:4], chunks[3], *chunks[4:]]
    return [*chunks[:-1], chunks[0]]  # "the last one replaced"


@pytest.mark.parametrize("how", ["dropped", "swapped", "repeated", "the last one replaced"])
def test_chunks_dropped_moved_or_repeated_are_refused(chunked: bytes, how: str) -> None:
    header, chunks = _chunks(chunked)
    with pytest.raises(sealed.SealError, match="changed since it was made"):
        sealed.unseal(header + b"".join(_moved(chunks, how)), PHRASE)


@pytest.mark.parametrize("kept", range(1, 9))
def test_a_file_cut_at_a_chunk_boundary_is_refused(chunked: bytes, kept: int) -> None:
    header, chunks = _chunks(chunked)
    with pytest.raises(sealed.SealError, match=rf"cut short: it ends after chunk {kept - 1},"):
        sealed.unseal(header + b"".join(chunks[:kept]), PHRASE)
    with pytest.raises(sealed.SealError, match="not an llmgw backup"):
        sealed.unseal(header[:-1], PHRASE)


EXTRA = [b"\0", bytes(SMALL + sealed.TAG_BYTES)]


@pytest.mark.parametrize("text", [TEXT[: 4 * SMALL], TEXT[:SMALL]], ids=["4-chunks", "1-chunk"])
@pytest.mark.parametrize("extra", EXTRA, ids=["1", "chunk"])
def test_bytes_after_a_full_last_chunk_are_refused_as_such(text: bytes, extra: bytes) -> None:
    box = sealed.seal(text, PHRASE, log2_n=10, chunk=SMALL)
    with pytest.raises(sealed.SealError, match=r"has bytes after its end \(appended"):
        sealed.unseal(box + extra, PHRASE)


@pytest.mark.parametrize("text", [TEXT, TEXT[:7]], ids=["9-chunks", "1-chunk"])
@pytest.mark.parametrize("extra", EXTRA, ids=["1", "chunk"])
def test_bytes_after_a_short_last_chunk_are_refused_as_a_change(text: bytes, extra: bytes) -> None:
    """They join the last chunk, whose end is not in the file (sealed._open_chunk)."""
    box = sealed.seal(text, PHRASE, log2_n=10, chunk=SMALL)
    last = (len(text) - 1) // SMALL
    why = rf"its chunk {last} does not" if last else "wrong passphrase, or .* changed since"
    with pytest.raises(sealed.SealError, match=why):
        sealed.unseal(box + extra, PHRASE)


def test_an_old_llmgw_sealed_1_file_still_opens() -> None:
    """A file as llmgw 0.1 sealed it: one AES-256-GCM over the whole, the header its
    associated data, the nonce in the header (made here as that release made it)."""
    salt, nonce = os.urandom(16), os.urandom(12)
    header = b"llmgw-sealed-1\n" + struct.pack(">BII", 10, 8, 1) + salt + nonce
    key = Scrypt(salt=salt, length=32, n=1 << 10, r=8, p=1).derive(PHRASE.encode())
    old = header + AESGCM(key).encrypt(nonce, b"the cluster's state", header)
    assert sealed.unseal(old, PHRASE) == b"the cluster's state"
    with pytest.raises(sealed.SealError, match="wrong passphrase"):
        sealed.unseal(old, PHRASE + "!")
    with pytest.raises(sealed.SealError, match="changed since it was made"):
        sealed.unseal(old[:-1] + bytes([old[-1] ^ 1]), PHRASE)


def test_sealing_holds_a_chunk_not_the_whole() -> None:
    """What Sealer keeps between writes is under two chunks, however much went through."""
    out = io.BytesIO()
    sealer = sealed.Sealer(out, PHRASE, log2_n=10, chunk=SMALL)
    for _ in range(100):
        sealer.write(os.urandom(50))
        assert len(sealer._held) <= SMALL  # what it holds is the point
    sealer.close()
    assert len(sealed.unseal(out.getvalue(), PHRASE)) == 5000


def test_a_sealer_closed_seals_no_second_last_chunk() -> None:
    out = io.BytesIO()
    sealer = sealed.Sealer(out, PHRASE, log2_n=10, chunk=SMALL)
    sealer.write(TEXT)
    sealer.close()
    whole = out.getvalue()
    with pytest.raises(ValueError, match="closed already"):
        sealer.close()
    with pytest.raises(ValueError, match="closed Sealer"):
        sealer.write(b"more")
    assert out.getvalue() == whole and sealed.unseal(whole, PHRASE) == TEXT
