"""A mirror set's fetch as it goes: one redrawn bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import click

from llmgw.api_types import SetStatus
from llmgw.cli.output import size

POLL_S = 0.5
PLAIN_EVERY_S = 5.0  # a plain line at most this often when stderr is not a terminal


def describe(s: SetStatus) -> str:
    """One line of a SetStatus: the whole set's bytes, rate, time left and files in flight."""
    total, done = s.bytes_total, s.bytes_done
    pct = 100.0 * done / total if total else 100.0
    parts = [
        f"{s.repo}: {pct:5.1f}%",
        f"{size(done)} of {size(total)}",
        f"{s.files_done}/{s.files} files",
    ]
    if s.rate_bytes_s:
        parts.append(f"{size(int(s.rate_bytes_s))}/s")
    if s.eta_s is not None:
        parts.append(f"{_duration(s.eta_s)} left")
    if s.verifying:
        parts.append("verifying " + ", ".join(s.verifying))
    elif s.current:
        parts.append(", ".join(s.current[:2]) + (" ..." if len(s.current) > 2 else ""))
    return ", ".join(parts)


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _bar(s: SetStatus, width: int = 24) -> str:
    total = s.bytes_total or 1
    filled = int(width * min(1.0, s.bytes_done / total))
    return "[" + "#" * filled + "-" * (width - filled) + "] "


def follow(poll: Callable[[], SetStatus | None]) -> SetStatus | None:
    """Show a set's progress until it is done or failed; returns its last status (None: the
    mirror had nothing to fetch). Goes to stderr, so stdout stays the command's answer."""
    tty = sys.stderr.isatty()
    last_plain = 0.0
    status = poll()
    while status is not None and status.state == "fetching":
        line = describe(status)
        if tty:
            click.echo("\r\x1b[2K" + _bar(status) + line, nl=False, err=True)
        elif time.monotonic() - last_plain >= PLAIN_EVERY_S:
            click.echo(line, err=True)
            last_plain = time.monotonic()
        time.sleep(POLL_S)
        status = poll()
    if status is not None:
        end = describe(status) + (f": {status.error}" if status.error else "")
        click.echo(("\r\x1b[2K" if tty else "") + _bar(status) * tty + end, err=True)
    return status
