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
import errno
import os
import socket
import time
from collections.abc import Mapping, MutableMapping, Sequence

from llmgw import sdnotify

LISTEN_FDS_START = 3  # SD_LISTEN_FDS_START
BIND_TRIES = 30
_taken = False  # take() reads what systemd passed once


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
    """The descriptors systemd passed under name (one name per process: those of any other
    name are closed and dropped from the store), once; the variables are unset, so no child
    sees them."""
    global _taken
    if _taken:
        return []
    _taken = True
    fds = passed(env, os.getpid())
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(var, None)
    for other, numbers in fds.items():
        for fd in numbers:
            if other == name:
                os.set_inheritable(fd, False)
            else:
                os.close(fd)
        if other != name:
            forget(other)  # else systemd passes them at every start, holding what they hold
    return fds.get(name, [])


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


def _bind_once(family: int, addr: tuple[str, int], backlog: int) -> socket.socket:
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
    return sock


def _bind(name: str, family: int, addr: tuple[str, int], backlog: int) -> socket.socket:
    """A listening socket on addr. Address in use while systemd may still hold a socket of
    ours there (it carries out FDSTOREREMOVE after this process asks): asked to drop those
    and tried again, BIND_TRIES times 0.1 s apart."""
    tries = 0
    while True:
        try:
            return _bind_once(family, addr, backlog)
        except OSError as e:
            tries += 1
            if e.errno != errno.EADDRINUSE or not sdnotify.notify_path() or tries >= BIND_TRIES:
                raise
            if tries == 1:
                forget(name)
            time.sleep(0.1)


def _address(sock: socket.socket) -> tuple[int, tuple[str, int]]:
    """A listening socket's (family, (address, port)), as _wanted says them."""
    addr = sock.getsockname()
    return int(sock.family), (str(addr[0]), int(addr[1]))


def _adopt(fds: list[int]) -> list[socket.socket]:
    """The passed descriptors as sockets; on a failure, every one closed."""
    socks: list[socket.socket] = []
    try:
        for fd in fds:
            socks.append(socket.socket(fileno=fd))
    except OSError:
        for sock in socks:
            sock.close()
        for fd in fds[len(socks) :]:
            os.close(fd)
        raise
    return socks


def listeners(name: str, host: str, port: int, backlog: int) -> list[socket.socket]:
    """The listening sockets for host:port: those systemd kept under name that host:port
    still binds, and new ones for the rest (systemd then keeps the new set)."""
    wanted = _wanted(host, port)
    kept = _adopt(take(name))
    reused = [s for s in kept if _address(s) in wanted]
    for sock in kept:
        if sock not in reused:
            sock.close()
    have = {_address(s) for s in reused}
    if len(reused) == len(kept) and have == set(wanted):
        for sock in reused:
            sock.setblocking(False)
        return reused
    if kept:
        forget(name)  # every socket of name; those reused are given again below
    socks = list(reused)
    try:
        for family, addr in wanted:
            if (family, addr) not in have:
                socks.append(_bind(name, family, addr, backlog))
    except OSError:
        for sock in socks:
            sock.close()
        raise
    for sock in socks:
        sock.setblocking(False)
    keep(name, socks)
    return socks
