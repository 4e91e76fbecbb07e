"""A file sealed with a passphrase: scrypt derives the key, AES-256-GCM encrypts and
authenticates (a wrong passphrase and a changed byte are both refused, nothing decrypted)."""

from __future__ import annotations

import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

MAGIC = b"llmgw-sealed-1\n"
# scrypt's cost: N = 2**17, r = 8, p = 1 (128 MiB, about half a second): OWASP's advice for
# scrypt. Kept in the header, so a later release may raise it and still open older files.
LOG2_N, R, P = 17, 8, 1
SALT_BYTES, NONCE_BYTES = 16, 12
_PARAMS = struct.Struct(">BII")  # log2 N, r, p
HEADER_BYTES = len(MAGIC) + _PARAMS.size + SALT_BYTES + NONCE_BYTES
MIN_PASSPHRASE = 12  # characters
MAX_LOG2_N = 22  # a header asking more (4 GiB with r = 8) is not one of ours
# The most a header may ask of scrypt: 128 * N * r * p bytes (its memory is 128 * N * r, its
# time grows with p as well): 4 GiB, 32 times ours, so a crafted file costs no more.
MAX_SCRYPT_BYTES = 4 << 30


class SealError(Exception):
    """The file cannot be opened with this passphrase; the message says why (never the
    passphrase)."""


def check_passphrase(passphrase: str) -> None:
    """SealError unless the passphrase is long enough to seal with."""
    if len(passphrase) < MIN_PASSPHRASE:
        raise SealError(f"the passphrase is shorter than {MIN_PASSPHRASE} characters")


def _key(passphrase: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    kdf = Scrypt(salt=salt, length=32, n=1 << log2_n, r=r, p=p)
    return kdf.derive(passphrase.encode())


def seal(plain: bytes, passphrase: str, *, log2_n: int = LOG2_N) -> bytes:
    """plain encrypted under passphrase, its header (salt, nonce, scrypt's cost) authenticated."""
    check_passphrase(passphrase)
    salt, nonce = os.urandom(SALT_BYTES), os.urandom(NONCE_BYTES)
    header = MAGIC + _PARAMS.pack(log2_n, R, P) + salt + nonce
    return header + AESGCM(_key(passphrase, salt, log2_n, R, P)).encrypt(nonce, plain, header)


def unseal(sealed: bytes, passphrase: str) -> bytes:
    """What seal() sealed; SealError for another file, a wrong passphrase or a changed byte."""
    if not sealed.startswith(MAGIC) or len(sealed) < HEADER_BYTES + 16:
        raise SealError("not an llmgw backup (no llmgw-sealed-1 header)")
    log2_n, r, p = _PARAMS.unpack_from(sealed, len(MAGIC))
    if not (1 <= log2_n <= MAX_LOG2_N and 1 <= r <= 64 and 1 <= p <= 16):
        raise SealError("the backup's header is damaged (scrypt's cost is out of range)")
    if 128 * (1 << log2_n) * r * p > MAX_SCRYPT_BYTES:
        raise SealError(
            f"the backup's header asks scrypt for N=2^{log2_n}, r={r}, p={p}: over the "
            f"{MAX_SCRYPT_BYTES >> 30} GiB this llmgw derives a key with (damaged, or not "
            "made by llmgw)"
        )
    at = len(MAGIC) + _PARAMS.size
    salt, nonce = sealed[at : at + SALT_BYTES], sealed[at + SALT_BYTES : HEADER_BYTES]
    key = _key(passphrase, salt, log2_n, r, p)
    try:
        return AESGCM(key).decrypt(nonce, sealed[HEADER_BYTES:], sealed[:HEADER_BYTES])
    except InvalidTag:
        raise SealError("wrong passphrase, or the backup was changed since it was made") from None


def read_passphrase(path: str) -> str:
    """A passphrase file's first line (its newline dropped); SealError if too short."""
    with open(path, encoding="utf-8") as f:
        passphrase = f.readline().rstrip("\r\n")
    check_passphrase(passphrase)
    return passphrase
