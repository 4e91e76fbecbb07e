"""A file sealed with a passphrase: scrypt derives the key, AES-256-GCM encrypts and
authenticates it chunk by chunk (STREAM, as age's payload), so that neither sealing nor
opening holds the whole file; a wrong passphrase, a changed byte and chunks dropped,
reordered, cut off or appended are all refused."""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

# llmgw-sealed-2: MAGIC, scrypt's cost (>BII), salt, the plaintext chunk's size (>I), then
# chunks: AES-256-GCM of CHUNK bytes each (the last one shorter, or empty only when the whole
# is), the header as associated data, nonce = 11-byte big-endian counter || 1 if the last
# chunk else 0. The key is the file's own (a random salt each file), so counters start at 0.
MAGIC = b"llmgw-sealed-2\n"
# llmgw-sealed-1 (llmgw 0.1): MAGIC_1, cost, salt, nonce, one AES-256-GCM of the whole.
MAGIC_1 = b"llmgw-sealed-1\n"
# scrypt's cost: N = 2**17, r = 8, p = 1 (128 MiB, about half a second): OWASP's advice for
# scrypt. Kept in the header, so a later release may raise it and still open older files.
LOG2_N, R, P = 17, 8, 1
SALT_BYTES, NONCE_BYTES, TAG_BYTES = 16, 12, 16
_PARAMS = struct.Struct(">BII")  # log2 N, r, p
_CHUNK = struct.Struct(">I")
HEADER_BYTES = len(MAGIC) + _PARAMS.size + SALT_BYTES + _CHUNK.size
HEADER_1_BYTES = len(MAGIC_1) + _PARAMS.size + SALT_BYTES + NONCE_BYTES
CHUNK = 1 << 20  # plaintext bytes a chunk: what sealing or opening holds at once
MAX_CHUNK = 16 << 20  # a header asking more is not one of ours
LAST_COUNTER = (1 << 88) - 1
MIN_PASSPHRASE = 12  # characters
MAX_LOG2_N = 22  # a header asking more (4 GiB with r = 8) is not one of ours
# The most a header may ask of scrypt: 128 * N * r * p bytes (its memory is 128 * N * r, its
# time grows with p as well): 4 GiB, 32 times ours, so a crafted file costs no more.
MAX_SCRYPT_BYTES = 4 << 30


class SealError(Exception):
    """The file cannot be opened with this passphrase; the message says why (never the
    passphrase)."""


class Writable(Protocol):
    """Where sealed bytes go: a binary file, a socket's writer."""

    def write(self, data: bytes, /) -> object: ...


class Readable(Protocol):
    """Where sealed bytes come from: a binary file."""

    def read(self, n: int = -1, /) -> bytes: ...


def check_passphrase(passphrase: str) -> None:
    """SealError unless the passphrase is long enough to seal with."""
    if len(passphrase) < MIN_PASSPHRASE:
        raise SealError(f"the passphrase is shorter than {MIN_PASSPHRASE} characters")


def _key(passphrase: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    """The file's AES-256 key: scrypt of the passphrase with the header's salt and cost."""
    kdf = Scrypt(salt=salt, length=32, n=1 << log2_n, r=r, p=p)
    return kdf.derive(passphrase.encode())


def _nonce(counter: int, last: bool) -> bytes:
    """Chunk counter's nonce: its 11-byte big-endian count, then 1 if it is the last."""
    if counter > LAST_COUNTER:
        raise SealError("the backup has more chunks than a nonce can count")
    return counter.to_bytes(11, "big") + (b"\x01" if last else b"\x00")


class Sealer:
    """Seals what is written to it into sink, a chunk at a time; close() writes the last
    chunk (until then the file opens as cut short)."""

    def __init__(
        self, sink: Writable, passphrase: str, *, log2_n: int = LOG2_N, chunk: int = CHUNK
    ) -> None:
        check_passphrase(passphrase)
        if not 1 <= chunk <= MAX_CHUNK:
            raise ValueError(f"a chunk of {chunk} bytes")
        salt = os.urandom(SALT_BYTES)
        self._header = MAGIC + _PARAMS.pack(log2_n, R, P) + salt + _CHUNK.pack(chunk)
        self._aead = AESGCM(_key(passphrase, salt, log2_n, R, P))
        self._sink, self._chunk, self._counter = sink, chunk, 0
        self._held = bytearray()
        self._closed = False
        self.plain_bytes = 0  # written to it so far
        sink.write(self._header)

    def write(self, data: bytes) -> None:
        """Seal data after what came before; a chunk is written once the next one begins
        (only close() knows which is the last); ValueError once closed."""
        if self._closed:
            raise ValueError("write to a closed Sealer: its last chunk is sealed")
        self._held += data
        self.plain_bytes += len(data)
        if len(self._held) <= self._chunk:
            return
        view, at = memoryview(self._held), 0
        while len(self._held) - at > self._chunk:
            self._emit(view[at : at + self._chunk], last=False)
            at += self._chunk
        view.release()
        del self._held[:at]

    def close(self) -> None:
        """Seal the last chunk: the file is whole. Once only: a second call is refused
        (ValueError), for a second last chunk would make the file one no llmgw opens."""
        if self._closed:
            raise ValueError("the Sealer is closed already: its last chunk is sealed")
        self._closed = True
        self._emit(memoryview(self._held), last=True)
        self._held = bytearray()

    def _emit(self, plain: memoryview, *, last: bool) -> None:
        """One chunk sealed under the next counter's nonce and written to the sink."""
        nonce = _nonce(self._counter, last)
        self._sink.write(self._aead.encrypt(nonce, bytes(plain), self._header))
        self._counter += 1


def seal(plain: bytes, passphrase: str, *, log2_n: int = LOG2_N, chunk: int = CHUNK) -> bytes:
    """plain sealed under passphrase (llmgw-sealed-2), its header authenticated."""
    out = io.BytesIO()
    sealer = Sealer(out, passphrase, log2_n=log2_n, chunk=chunk)
    sealer.write(plain)
    sealer.close()
    return out.getvalue()


def unseal(sealed: bytes, passphrase: str) -> bytes:
    """What seal() sealed; SealError for another file, a wrong passphrase or a change."""
    return b"".join(opened(io.BytesIO(sealed), passphrase))


def _read(source: Readable, n: int) -> bytes:
    """n bytes of source, fewer only at its end."""
    got = source.read(n)
    while len(got) < n:
        more = source.read(n - len(got))
        if not more:
            break
        got += more
    return got


def _cost(header: bytes, at: int) -> tuple[int, int, int]:
    """The header's scrypt cost; SealError when out of range or over MAX_SCRYPT_BYTES."""
    log2_n, r, p = _PARAMS.unpack_from(header, at)
    if not (1 <= log2_n <= MAX_LOG2_N and 1 <= r <= 64 and 1 <= p <= 16):
        raise SealError("the backup's header is damaged (scrypt's cost is out of range)")
    if 128 * (1 << log2_n) * r * p > MAX_SCRYPT_BYTES:
        raise SealError(
            f"the backup's header asks scrypt for N=2^{log2_n}, r={r}, p={p}: over the "
            f"{MAX_SCRYPT_BYTES >> 30} GiB this llmgw derives a key with (damaged, or not "
            "made by llmgw)"
        )
    return log2_n, r, p


def opened(source: Readable, passphrase: str) -> Iterator[bytes]:
    """The plaintext of a sealed file, chunk by chunk, each authenticated before it is
    yielded; SealError (wrong passphrase, a change, chunks missing, moved or added) at the
    chunk where it shows. Only a generator run to its end has seen the whole file verified:
    keep what it yields aside until then. An llmgw-sealed-1 file is opened whole."""
    magic = _read(source, len(MAGIC))
    if magic == MAGIC_1:
        yield _unseal_1(magic + source.read(), passphrase)
        return
    header = magic + _read(source, HEADER_BYTES - len(magic))
    if magic != MAGIC or len(header) < HEADER_BYTES:
        raise SealError("not an llmgw backup (no llmgw-sealed-2 or -1 header)")
    log2_n, r, p = _cost(header, len(MAGIC))
    (chunk,) = _CHUNK.unpack_from(header, HEADER_BYTES - _CHUNK.size)
    if not 1 <= chunk <= MAX_CHUNK:
        raise SealError("the backup's header is damaged (its chunk size is out of range)")
    salt = header[len(MAGIC) + _PARAMS.size : len(MAGIC) + _PARAMS.size + SALT_BYTES]
    aead = AESGCM(_key(passphrase, salt, log2_n, r, p))
    counter, block = 0, _read(source, chunk + TAG_BYTES)
    while True:
        ahead = _read(source, 1) if len(block) == chunk + TAG_BYTES else b""
        last = not ahead  # a full chunk followed by nothing is the last one too
        plain = _open_chunk(aead, header, counter, block, last)
        if last and not plain and counter:
            raise SealError("the backup ends in an empty chunk (changed since it was made)")
        yield plain
        if last:
            return
        counter += 1
        block = ahead + _read(source, chunk + TAG_BYTES - 1)


class PlainReader:
    """opened() as a file to read(): a read that returns b"" (the end) has seen the whole
    file verified; one that raises SealError has found it damaged."""

    def __init__(self, source: Readable, passphrase: str) -> None:
        self._chunks = opened(source, passphrase)
        self._held, self._at = b"", 0

    def peek(self, n: int) -> bytes:
        """The next n bytes (fewer at the end), left to be read."""
        while len(self._held) - self._at < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._held, self._at = self._held[self._at :] + chunk, 0
        return self._held[self._at : self._at + n]

    def read(self, n: int = -1, /) -> bytes:
        """Up to n bytes (all that are left for n < 0); b"" only at the verified end."""
        while self._at >= len(self._held):
            chunk = next(self._chunks, None)
            if chunk is None:
                return b""
            self._held, self._at = chunk, 0
        if n < 0:
            rest = [self._held[self._at :], *self._chunks]
            self._held, self._at = b"", 0
            return b"".join(rest)
        piece = self._held[self._at : self._at + n]
        self._at += len(piece)
        return piece


def _open_chunk(aead: AESGCM, header: bytes, counter: int, block: bytes, last: bool) -> bytes:
    """One chunk's plaintext, or SealError saying what its failure means: one that opens
    under the other flag is the file cut after it (it is not the last) or bytes after its
    end (it is); one that opens under neither is a wrong passphrase (the first) or a change.
    Bytes appended after a short last chunk join it and show as a change: where it ended is
    not in the file, and finding it would take a decryption for each byte of it."""
    try:
        return aead.decrypt(_nonce(counter, last), block, header)
    except InvalidTag:
        pass
    try:
        aead.decrypt(_nonce(counter, not last), block, header)
    except InvalidTag:
        if counter == 0:
            raise SealError(
                "wrong passphrase, or the backup was changed since it was made"
            ) from None
        raise SealError(
            f"the backup was changed since it was made (its chunk {counter} does not "
            "authenticate: changed, dropped or moved)"
        ) from None
    if last:
        raise SealError(f"the backup is cut short: it ends after chunk {counter}, not its last")
    raise SealError("the backup has bytes after its end (appended since it was made)")


def _unseal_1(sealed: bytes, passphrase: str) -> bytes:
    """An llmgw-sealed-1 file's plaintext: one AES-256-GCM over the whole, in memory."""
    if len(sealed) < HEADER_1_BYTES + TAG_BYTES:
        raise SealError("not an llmgw backup (its llmgw-sealed-1 header is cut short)")
    log2_n, r, p = _cost(sealed, len(MAGIC_1))
    at = len(MAGIC_1) + _PARAMS.size
    salt, nonce = sealed[at : at + SALT_BYTES], sealed[at + SALT_BYTES : HEADER_1_BYTES]
    key = _key(passphrase, salt, log2_n, r, p)
    try:
        return AESGCM(key).decrypt(nonce, sealed[HEADER_1_BYTES:], sealed[:HEADER_1_BYTES])
    except InvalidTag:
        raise SealError("wrong passphrase, or the backup was changed since it was made") from None


def read_passphrase(path: str) -> str:
    """A passphrase file's first line (its newline dropped); SealError if too short."""
    with open(path, encoding="utf-8") as f:
        passphrase = f.readline().rstrip("\r\n")
    check_passphrase(passphrase)
    return passphrase
