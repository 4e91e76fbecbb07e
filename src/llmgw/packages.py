"""A .deb's or .rpm's name, version and architecture, read from the file's own headers."""

from __future__ import annotations

import io
import struct
import tarfile
from pathlib import Path
from typing import BinaryIO, Literal

import msgspec

Kind = Literal["deb", "rpm"]
MAX_CONTROL_BYTES = 16 << 20  # a control.tar or an rpm header larger than this is refused
_AR_MAGIC = b"!<arch>\n"
_RPM_LEAD = b"\xed\xab\xee\xdb"
_RPM_HEADER = b"\x8e\xad\xe8\x01"
_RPM_TAGS = {1000: "name", 1001: "version", 1002: "release", 1022: "arch"}


class PackageError(Exception):
    """The file is no package this reads (its message says what is wrong)."""


class PackageInfo(msgspec.Struct, frozen=True):
    """What a package says of itself."""

    kind: Kind
    name: str  # "llmgw-agentd"
    version: str  # the package manager's ("0.2.0", "0.2.0-1"; an rpm's without its release)
    arch: str  # "amd64", "all", "x86_64", "noarch"

    @property
    def release(self) -> str:
        """The llmgw release it carries, as package_version() says it (epoch, Debian
        revision and "~" dropped: 1:0.2.0~rc1-1 -> 0.2.0rc1)."""
        version = self.version.split(":", 1)[-1]
        if self.kind == "deb" and "-" in version:
            version = version.rsplit("-", 1)[0]
        return version.replace("~", "")


def read(path: Path) -> PackageInfo:
    """A .deb's or .rpm's header, told apart by their first bytes; PackageError otherwise."""
    with path.open("rb") as f:
        head = f.read(8)
        f.seek(0)
        if head == _AR_MAGIC:
            return _deb(f)
        if head[:4] == _RPM_LEAD:
            return _rpm(f)
    raise PackageError(f"{path.name}: neither a .deb (ar archive) nor an .rpm")


def _deb(f: BinaryIO) -> PackageInfo:
    """The control file of a .deb: its ar members walked to control.tar[.gz|.xz|.bz2]."""
    f.seek(len(_AR_MAGIC))
    while True:
        header = f.read(60)
        if len(header) < 60:
            raise PackageError("a .deb without a control.tar member")
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise PackageError("a .deb with a broken ar header") from None
        if name.startswith("control.tar"):
            if size > MAX_CONTROL_BYTES:
                raise PackageError(f"a .deb whose {name} is over {MAX_CONTROL_BYTES} bytes")
            return _control(name, f.read(size))
        f.seek(size + (size & 1), io.SEEK_CUR)


def _control(member: str, data: bytes) -> PackageInfo:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            entry = next((m for m in tar if m.name in ("./control", "control")), None)
            handle = tar.extractfile(entry) if entry is not None else None
            text = handle.read().decode("utf-8", "replace") if handle is not None else ""
    except (tarfile.TarError, EOFError, OSError) as e:
        why = f"a .deb whose {member} cannot be read ({e}); zstd is not read here"
        raise PackageError(why) from None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and not line[:1].isspace():
            fields[key.strip().lower()] = value.strip()
    try:
        return PackageInfo("deb", fields["package"], fields["version"], fields["architecture"])
    except KeyError as e:
        raise PackageError(f"a .deb whose control file has no {e.args[0].title()}") from None


def _rpm_header(f: BinaryIO) -> tuple[list[tuple[int, int, int, int]], bytes]:
    """One header structure at f's position: its index entries and its data store."""
    intro = f.read(16)
    if len(intro) < 16 or intro[:4] != _RPM_HEADER:
        raise PackageError("an .rpm with a broken header")
    count, size = struct.unpack(">II", intro[8:16])
    if count * 16 + size > MAX_CONTROL_BYTES:
        raise PackageError(f"an .rpm whose header is over {MAX_CONTROL_BYTES} bytes")
    index = [struct.unpack(">iiii", f.read(16)) for _ in range(count)]
    return index, f.read(size)


def _rpm(f: BinaryIO) -> PackageInfo:
    """The main header's NAME, VERSION, RELEASE and ARCH (after the lead and the signature
    header, which is padded to 8 bytes)."""
    f.seek(96)
    index, store = _rpm_header(f)
    f.seek((8 - len(store) % 8) % 8, io.SEEK_CUR)
    index, store = _rpm_header(f)
    found: dict[str, str] = {}
    for tag, _type, offset, _count in index:
        if tag in _RPM_TAGS and 0 <= offset < len(store):
            end = store.find(b"\0", offset)
            found[_RPM_TAGS[tag]] = store[offset : end if end >= 0 else None].decode("utf-8")
    if not {"name", "version", "arch"} <= found.keys():
        raise PackageError("an .rpm whose header lacks its name, version or arch")
    return PackageInfo("rpm", found["name"], found["version"], found["arch"])
