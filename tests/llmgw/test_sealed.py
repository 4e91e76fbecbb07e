"""A sealed backup file: opened only with its passphrase, whole; another file, a damaged
header or a changed byte refused, and a short passphrase refused before anything is sealed."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

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
