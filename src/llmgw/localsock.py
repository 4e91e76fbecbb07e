"""Local Unix sockets of the daemons: who is calling (SO_PEERCRED) and who may."""

from __future__ import annotations

import grp
import logging
import os
import pwd
import socket
import struct
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)


def allowed(uid: int, gid: int, group: str, *, own_uid: int | None = None) -> bool:
    """Whether a local caller may use the API: root, the daemon's own user, or a member of group.

    gid is the caller's effective group at connect time; membership is otherwise read from
    the user and group databases (primary and supplementary groups).
    """
    if uid in (0, os.getuid() if own_uid is None else own_uid):
        return True
    try:
        group_entry = grp.getgrnam(group)
    except KeyError:
        return False
    if gid == group_entry.gr_gid:
        return True
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    return user.pw_gid == group_entry.gr_gid or user.pw_name in group_entry.gr_mem


_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_credentials(request: web.Request) -> tuple[int, int, int] | None:
    """The (pid, uid, gid) of the process at the other end of a Unix socket, else None."""
    transport = request.transport
    sock: Any = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def secure_socket(path: str, group: str) -> None:
    """Make a freshly bound socket usable by root and group only (0660, group-owned).

    The peer-credential check is the real gate; this keeps other users from connecting.
    """
    os.chmod(path, 0o660)
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        log.warning("group %s does not exist: only root can use %s", group, path)
        return
    os.chown(path, -1, gid)
