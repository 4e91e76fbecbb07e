"""Listening sockets kept by systemd across a restart: given to its file descriptor store.

llmgwd binds its client port once and gives the sockets to systemd (`FDSTORE=1`, with
`FileDescriptorStoreMax=` in the unit); on `systemctl restart` (a package upgrade does one)
systemd holds them through the gap and passes them back (`LISTEN_FDS`, `LISTEN_FDNAMES`), so a
connection made meanwhile waits in the kernel's queue for the new process instead of being
refused. A clean stop releases them, and the port closes.

Written here rather than pulled in: it is sd_listen_fds' environment and one sendmsg with
SCM_RIGHTS on the notify socket (python-systemd is a C extension Debian's Python would need).
"""

from __future__ import annotations

import array
import os
import socket
from collections.abc import Mapping, MutableMapping, Sequence

from llmgw import sdnotify

LISTEN_FDS_START = 3  # SD_LISTEN_FDS_START
_taken: dict[str, list[int]] | None = None


def passed(env: Mapping[str, str], pid: int) -> dict[str, list[int]]:
    """The descriptors systemd passed to process pid, by name (unnamed ones: "unknown")."""
    if env.get("LISTEN_PID") != str(pid):
        return {}
    try:
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        return {}
    names = env.get("LISTEN_FDNAMES", "").split(":")
    out: dict[str, list[int]] = {}
    for i in range(max(count, 0)):
        name = names[i] if i < len(names) and names[i] else "unknown"
        out.setdefault(name, []).append(LISTEN_FDS_START + i)
    return out


def take(name: str, env: MutableMapping[str, str] = os.environ) -> list[int]:
    """The descriptors systemd passed under name, once (the variables are then unset, so no
    child sees them); close-on-exec set."""
    global _taken
    if _taken is None:
        _taken = passed(env, os.getpid())
        for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            env.pop(var, None)
        for fds in _taken.values():
            for fd in fds:
                os.set_inheritable(fd, False)
    return _taken.pop(name, [])


def keep(name: str, socks: Sequence[socket.socket]) -> bool:
    """Give systemd the sockets to hold under name; False when not run by systemd."""
    path = sdnotify.notify_path()
    if not path or not socks:
        return False
    fields = f"FDSTORE=1\nFDNAME={name}".encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        try:
            rights = array.array("i", [x.fileno() for x in socks])
            s.sendmsg([fields], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)], 0, path)
        except OSError:
            return False
    return True


def forget(name: str) -> None:
    """Have systemd close what it holds under name (settings moved the port)."""
    sdnotify.notify("FDSTOREREMOVE=1", f"FDNAME={name}")


def _wanted(host: str, port: int) -> list[tuple[int, tuple[str, int]]]:
    """The (family, (address, port)) pairs a listener on host:port binds, as asyncio's
    create_server does (every address of the name; all of them for "")."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)  # fmt: skip
    seen: list[tuple[int, tuple[str, int]]] = []
    for family, _, _, _, addr in infos:
        pair = (int(family), (str(addr[0]), int(addr[1])))
        if family in (socket.AF_INET, socket.AF_INET6) and pair not in seen:
            seen.append(pair)
    return seen


def _bind(family: int, addr: tuple[str, int], backlog: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # as asyncio: an IPv6 socket takes IPv6 only
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _address(sock: socket.socket) -> tuple[int, tuple[str, int]]:
    addr = sock.getsockname()
    return int(sock.family), (str(addr[0]), int(addr[1]))


def listeners(name: str, host: str, port: int, backlog: int) -> list[socket.socket]:
    """The listening sockets for host:port: those systemd kept under name when they are
    still what host:port binds, else new ones, given to systemd to keep."""
    kept = [socket.socket(fileno=fd) for fd in take(name)]
    wanted = _wanted(host, port)
    if kept and sorted(map(_address, kept)) == sorted(wanted):
        for sock in kept:
            sock.setblocking(False)
        return kept
    for sock in kept:
        sock.close()
    if kept:
        forget(name)
    socks: list[socket.socket] = []
    try:
        for family, addr in wanted:
            socks.append(_bind(family, addr, backlog))
    except OSError:
        for sock in socks:
            sock.close()
        raise
    keep(name, socks)
    return socks
