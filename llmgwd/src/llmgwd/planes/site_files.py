"""The files a control plane's settings name outside its state dir (the OIDC client secret, the
client port's certificate and key, LDAP's bind password): read into a backup with their modes
and owners, and written back by a restore."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from llmgw import atomic
from llmgw.api_types import SiteFile
from llmgw.config import ServerConfig


class SiteFileError(Exception):
    """A named file cannot be backed up or restored; the message says which and why (never
    what it holds)."""


def named(cfg: ServerConfig) -> list[str]:
    """The files cfg names that a backup keeps, each once."""
    paths = (cfg.oidc.client_secret_file, cfg.client.tls_cert, cfg.client.tls_key,
             cfg.ldap.bind_password_file)  # fmt: skip
    return list(dict.fromkeys(p for p in paths if p))


def _name(lookup: str, number: int) -> str:
    """The user's or group's name (its number where it has none)."""
    try:
        if lookup == "user":
            return pwd.getpwuid(number).pw_name
        return grp.getgrgid(number).gr_name
    except KeyError:
        return str(number)


def read(cfg: ServerConfig) -> tuple[SiteFile, ...]:
    """The files cfg names, as they are on this host; SiteFileError if one cannot be read."""
    found = []
    for path in named(cfg):
        try:
            st = os.stat(path)
            data = Path(path).read_bytes()
        except OSError as e:
            raise SiteFileError(f"{path} (named in the settings) cannot be read: "
                                f"{e.strerror}") from None  # fmt: skip
        owner, group = _name("user", st.st_uid), _name("group", st.st_gid)
        mode = stat.S_IMODE(st.st_mode)
        found.append(SiteFile(path=os.path.abspath(path), data=data, mode=mode, owner=owner,
                              group=group))  # fmt: skip
    return tuple(found)


@dataclass(frozen=True, slots=True)
class Planned:
    """A file to write: the backup's, and the owner's numbers on this host."""

    file: SiteFile
    uid: int
    gid: int


def _number(lookup: str, name: str) -> int:
    try:
        if lookup == "user":
            return pwd.getpwnam(name).pw_uid
        return grp.getgrnam(name).gr_gid
    except KeyError:
        if name.isdigit():
            return int(name)
        raise SiteFileError(f"there is no {lookup} {name} here") from None


def plan(files: tuple[SiteFile, ...]) -> list[Planned]:
    """What restore writes; SiteFileError (before anything is written) for a file there
    already with other bytes, or an owner this host lacks."""
    planned = []
    for f in files:
        path = Path(f.path)
        if not path.is_absolute():
            raise SiteFileError(f"{f.path}: not an absolute path")
        with contextlib.suppress(FileNotFoundError):
            if path.read_bytes() != f.data:
                raise SiteFileError(f"{path} exists and differs from the backup's: move it "
                                    "away first")  # fmt: skip
        try:
            planned.append(Planned(f, _number("user", f.owner), _number("group", f.group)))
        except SiteFileError as e:
            raise SiteFileError(f"{path}'s owner: {e}") from None
    return planned


def write(planned: list[Planned]) -> None:
    """Write each file atomically with its mode and owner (its directory made if missing),
    through a new file of a random name (atomic.write: no link planted beside it followed)."""
    for p in planned:
        path = Path(p.file.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write(path, p.file.data, mode=p.file.mode, uid=p.uid, gid=p.gid)
