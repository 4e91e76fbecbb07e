"""A package's name, version and arch read from its own headers: a .deb's control file (its ar
members walked), an .rpm's main header; checked against dpkg-deb and rpm where they are here."""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest

from llmgw import packages


def _ar_member(name: str, data: bytes) -> bytes:
    header = f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode()
    return header + data + (b"\n" if len(data) % 2 else b"")


def _tar(files: dict[str, bytes], mode: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as tar:  # type: ignore[call-overload]
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def make_deb(path: Path, name: str, version: str, arch: str = "amd64", xz: bool = True) -> Path:
    """A .deb as dpkg-deb lays it out (debian-binary, control.tar, data.tar), with padding."""
    control = f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\nDescription: x\n y\n"
    ext, mode = (".xz", "w:xz") if xz else (".gz", "w:gz")
    members = [
        _ar_member("debian-binary", b"2.0\n"),
        _ar_member("control.tar" + ext, _tar({"./control": control.encode()}, mode)),
        _ar_member("data.tar" + ext, _tar({"./usr/share/doc/x": b"odd"}, mode)),
    ]
    path.write_bytes(b"!<arch>\n" + b"".join(members))
    return path


def _header(tags: list[tuple[int, str]]) -> bytes:
    store, index = b"", b""
    for tag, value in tags:
        index += struct.pack(">iiii", tag, 6, len(store), 1)  # 6: STRING
        store += value.encode() + b"\0"
    return b"\x8e\xad\xe8\x01\0\0\0\0" + struct.pack(">II", len(tags), len(store)) + index + store


def make_rpm(path: Path, name: str, version: str, arch: str = "x86_64") -> Path:
    """An .rpm's lead, a signature header (padded to 8 bytes) and a main header."""
    lead = b"\xed\xab\xee\xdb\x03\x00\x00\x00\x00\x01" + name.encode().ljust(66, b"\0")
    lead += b"\x00\x01\x00\x05" + b"\0" * 16
    sig = _header([(1000, "sig")])
    sig += b"\0" * ((8 - len(sig) % 8) % 8)
    main = _header([(1000, name), (1001, version), (1002, "1.el9"), (1022, arch)])
    path.write_bytes(lead + sig + main + b"payload")
    return path


@pytest.mark.parametrize("xz", [True, False])
def test_a_deb_is_read_as_dpkg_deb_reads_it(tmp_path: Path, xz: bool) -> None:
    deb = make_deb(tmp_path / "a.deb", "llmgw-agentd", "1:0.2.0~rc1-1", xz=xz)
    info = packages.read(deb)
    assert info == packages.PackageInfo("deb", "llmgw-agentd", "1:0.2.0~rc1-1", "amd64")
    assert info.release == "0.2.0rc1"
    if shutil.which("dpkg-deb"):
        out = subprocess.run(["dpkg-deb", "-f", str(deb), "Package", "Version"],
                             check=True, capture_output=True, text=True).stdout  # fmt: skip
        assert out.split() == ["Package:", info.name, "Version:", info.version]


def test_an_rpm_is_read_from_its_main_header(tmp_path: Path) -> None:
    info = packages.read(make_rpm(tmp_path / "a.rpm", "llmgwd", "0.2.0"))
    assert info == packages.PackageInfo("rpm", "llmgwd", "0.2.0", "x86_64")
    assert info.release == "0.2.0"


@pytest.mark.skipif(not shutil.which("rpmbuild"), reason="no rpmbuild here")
def test_an_rpm_that_rpmbuild_made(tmp_path: Path) -> None:
    spec = tmp_path / "x.spec"
    spec.write_text(
        "Name: llmgw\nVersion: 0.3.0\nRelease: 2\nSummary: x\nLicense: MIT\nBuildArch: noarch\n"
        "%description\nx\n%files\n"
    )
    subprocess.run(["rpmbuild", "-bb", "--define", f"_topdir {tmp_path}", str(spec)],
                   check=True, capture_output=True)  # fmt: skip
    rpm = next((tmp_path / "RPMS").rglob("*.rpm"))
    assert packages.read(rpm) == packages.PackageInfo("rpm", "llmgw", "0.3.0", "noarch")


def test_anything_else_is_refused_saying_what(tmp_path: Path) -> None:
    (tmp_path / "x.deb").write_bytes(b"PK\x03\x04 a zip")
    with pytest.raises(packages.PackageError, match=r"neither a \.deb"):
        packages.read(tmp_path / "x.deb")
    (tmp_path / "y.deb").write_bytes(b"!<arch>\n" + _ar_member("debian-binary", b"2.0\n"))
    with pytest.raises(packages.PackageError, match=r"without a control\.tar"):
        packages.read(tmp_path / "y.deb")
