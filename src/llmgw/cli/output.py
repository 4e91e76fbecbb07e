"""How commands print: aligned tables for people, the API's JSON with --json."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
import msgspec

F = TypeVar("F", bound=Callable[..., Any])


def json_option(f: F) -> F:
    """The --json flag every listing command has."""
    return click.option("--json", "as_json", is_flag=True, help="Print the API's JSON answer.")(f)


def echo_json(data: Any) -> None:
    """Print data as indented JSON."""
    click.echo(msgspec.json.format(msgspec.json.encode(data), indent=2).decode())


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns aligned on their widest cell; the last column is not padded."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def echo_table(headers: Sequence[str], rows: Sequence[Sequence[object]], empty: str) -> None:
    """Print a table, or a sentence when there is nothing to list."""
    click.echo(table(headers, rows) if rows else empty)


def ago(ts: float, now: float | None = None) -> str:
    """A past time as '5s ago', '3m ago', '2h ago', '4d ago'."""
    if ts <= 0:
        return "never"
    s = max(0, int((time.time() if now is None else now) - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit} ago"
    return f"{s}s ago"


def when(ts: float) -> str:
    """A time as local 'YYYY-MM-DD HH:MM'."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts > 0 else "-"


def size(n: int) -> str:
    """Bytes as GiB, MiB or KiB, one decimal (a few bytes as bytes)."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 10):.1f} KiB" if n >= 1 << 10 else f"{n} bytes"
