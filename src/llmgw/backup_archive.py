"""A backup as a stream: what POST /backup answers `llmgw backup` with and what an
llmgw-sealed-2 file holds. MAGIC, the bundle (msgpack, its store left empty) after its
length, then the store file (state.db) after its length: written and read a piece at a time,
so that neither end holds the store."""

from __future__ import annotations

import struct

import msgspec

from llmgw.api_types import BUNDLE_FORMAT, BackupBundle
from llmgw.sealed import Readable, SealError, Writable

MAGIC = b"llmgw-backup-1\n"
MEDIA_TYPE = "application/vnd.llmgw.backup"  # POST /backup's Accept for this stream
PIECE = 1 << 20  # bytes read or written at once
MAX_BUNDLE = 64 << 20  # the bundle without its store: settings, CA, named files
_LENGTH = struct.Struct(">Q")


class ArchiveError(SealError):
    """The stream is not a whole backup this llmgw reads; the message says why."""


def head(bundle: BackupBundle, store_bytes: int) -> bytes:
    """The stream's first bytes: MAGIC, the bundle without its store, the store's length."""
    meta = msgspec.msgpack.encode(msgspec.structs.replace(bundle, store=b""))
    return MAGIC + _LENGTH.pack(len(meta)) + meta + _LENGTH.pack(store_bytes)


def _exactly(source: Readable, n: int, what: str) -> bytes:
    """n bytes of source; ArchiveError, naming what they were to be, if it ends first."""
    got = source.read(n)
    while len(got) < n:
        more = source.read(n - len(got))
        if not more:
            raise ArchiveError(f"the backup is cut short (in {what})")
        got += more
    return got


def decode_bundle(data: bytes) -> BackupBundle:
    """A msgpack bundle; ArchiveError when this llmgw cannot read it."""
    try:
        bundle = msgspec.msgpack.decode(data, type=BackupBundle)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ArchiveError(f"the backup opened, but this llmgw cannot read it: {e}") from None
    return readable(bundle)


def readable(bundle: BackupBundle) -> BackupBundle:
    """The bundle, if of the format this llmgw reads; else ArchiveError."""
    if bundle.format != BUNDLE_FORMAT:
        raise ArchiveError(f"the backup's format is {bundle.format}; this llmgw reads "
                           f"{BUNDLE_FORMAT}")  # fmt: skip
    return bundle


def read_head(source: Readable) -> tuple[BackupBundle, int]:
    """The bundle (its store empty) and the store's length, read off source's start."""
    if _exactly(source, len(MAGIC), "its header") != MAGIC:
        raise ArchiveError("the backup opened, but holds no llmgw-backup-1 stream")
    (n,) = _LENGTH.unpack(_exactly(source, _LENGTH.size, "its header"))
    if n > MAX_BUNDLE:
        raise ArchiveError(f"the backup's bundle claims {n} bytes, over {MAX_BUNDLE}")
    bundle = decode_bundle(_exactly(source, n, "its bundle"))
    (store_bytes,) = _LENGTH.unpack(_exactly(source, _LENGTH.size, "its bundle"))
    return bundle, store_bytes


def copy_store(source: Readable, store_bytes: int, sink: Writable) -> None:
    """The store's store_bytes bytes from source into sink, PIECE at a time, then the
    stream's end: ArchiveError if it is cut short or goes on."""
    left = store_bytes
    while left:
        piece = source.read(min(PIECE, left))
        if not piece:
            raise ArchiveError(f"the backup is cut short ({left} bytes of its store missing)")
        sink.write(piece)
        left -= len(piece)
    if source.read(1):
        raise ArchiveError("the backup has bytes after its store")


class Discard:
    """A sink that keeps nothing."""

    def write(self, data: bytes, /) -> int:
        """Drop data."""
        return len(data)
