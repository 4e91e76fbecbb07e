"""A sealed backup file: opened only with its passphrase, whole; another file, a damaged
header or a changed byte refused, and a short passphrase refused before anything is sealed."""

from __future__ import annotations

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


def test_a_short_passphrase_is_refused(tmp_path: Path) -> None:
    with pytest.raises(sealed.SealError, match="shorter than 12"):
        sealed.seal(b"x", "short")
    f = tmp_path / "phrase"
    f.write_text(PHRASE + "\nsecond line ignored\n")
    assert sealed.read_passphrase(str(f)) == PHRASE
    f.write_text("short\n")
    with pytest.raises(sealed.SealError, match="shorter than 12"):
        sealed.read_passphrase(str(f))
