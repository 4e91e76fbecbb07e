"""systemd's notify protocol (READY, STATUS, WATCHDOG): a datagram to $NOTIFY_SOCKET.

Written here rather than pulled in: the protocol is one sendto() on an AF_UNIX socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket


def notify_path() -> str:
    """$NOTIFY_SOCKET as an address to send to ("" when not run by systemd)."""
    path = os.environ.get("NOTIFY_SOCKET", "")
    return "\0" + path[1:] if path.startswith("@") else path  # "@": the abstract namespace


def notify(*fields: str) -> bool:
    """Send KEY=VALUE fields to systemd; False when not run by systemd with NotifyAccess."""
    path = notify_path()
    if not path:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        try:
            s.sendto("\n".join(fields).encode(), path)
        except OSError:
            return False
    return True


def ready(status: str) -> None:
    """Tell systemd the service now really serves."""
    notify("READY=1", f"STATUS={status}")


def status(text: str) -> None:
    """Show text in `systemctl status`."""
    notify(f"STATUS={text}")


def stopping() -> None:
    """Tell systemd a clean stop has begun."""
    notify("STOPPING=1")


def watchdog_interval() -> float | None:
    """Half of WatchdogSec (seconds), when systemd asked this process for pings."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6


async def watchdog() -> None:
    """Pet systemd's watchdog for as long as the event loop runs (a stuck loop stops it)."""
    interval = watchdog_interval()
    if interval is None:
        return
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            notify("WATCHDOG=1")
            await asyncio.sleep(interval)
