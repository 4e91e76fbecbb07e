"""How commands print: aligned tables for people, the API's answer as JSON or YAML with -o,
and the question asked before a delete that takes other things with it."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click
import msgspec
import yaml

F = TypeVar("F", bound=Callable[..., Any])


def json_option(f: F) -> F:
    """The --json flag every listing command has."""
    return click.option("--json", "as_json", is_flag=True, help="Print the API's JSON answer.")(f)


def echo_json(data: Any) -> None:
    """Print data as indented JSON."""
    click.echo(msgspec.json.format(msgspec.json.encode(data), indent=2).decode())


@dataclass(frozen=True, slots=True)
class Listing:
    """How a listing prints: as a table (wide: with every column), or the answer as JSON or
    YAML; headers False drops the table's header line."""

    form: str = ""  # "", "wide", "json" or "yaml"
    headers: bool = True

    def raw(self, answer: Any) -> bool:
        """Print the answer as JSON or YAML if asked for; whether it was."""
        if self.form == "json":
            echo_json(answer)
        elif self.form == "yaml":
            click.echo(yaml.safe_dump(answer, sort_keys=False, allow_unicode=True), nl=False)
        return self.form in ("json", "yaml")

    def table(
        self, headers: Sequence[str], rows: Sequence[Sequence[object]], empty: str, shown: int = 0
    ) -> None:
        """Print the rows, their first shown columns only unless wide (0: all); with nothing
        to list, the sentence empty (on stderr without headers, so stdout has no lines)."""
        n = len(headers) if self.form == "wide" or not shown else shown
        if not rows:
            click.echo(empty, err=not self.headers)
            return
        lines = table(headers[:n], [r[:n] for r in rows]).splitlines()
        click.echo("\n".join(lines if self.headers else lines[1:]))


def listing_options(f: F) -> F:
    """-o json|yaml|wide, --json (as -o json) and --no-headers; the command gets out, a
    Listing, in their place."""

    @functools.wraps(f)
    def run(*args: Any, output: str | None, as_json: bool, no_headers: bool, **kw: Any) -> Any:
        if as_json and output not in (None, "json"):
            raise click.UsageError(f"--json and -o {output}: give one of them")
        form = "json" if as_json else output or ""
        return f(*args, out=Listing(form=form, headers=not no_headers), **kw)

    for option in (
        click.option("--no-headers", is_flag=True, help="Print the table without its header."),
        click.option("--json", "as_json", is_flag=True, help="Print the API's JSON (-o json)."),
        click.option(
            "-o",
            "--output",
            type=click.Choice(["json", "yaml", "wide"]),
            help="The API's answer as JSON or YAML, or the table with every column.",
        ),
    ):
        run = option(run)
    return run  # type: ignore[return-value]  # run takes options f lacks: no F says that


class NotConfirmed(click.ClickException):
    """A delete that takes other things with it, not confirmed: a usage error (exit 2)."""

    exit_code = 2


def yes_option(f: F) -> F:
    """The --yes flag of a delete that asks first."""
    return click.option("-y", "--yes", is_flag=True, help="Do not ask first.")(f)


def interactive() -> bool:
    """Whether a person can answer a question: stdin is a terminal."""
    return sys.stdin.isatty()


def confirm(yes: bool, what: str) -> None:
    """Ask before doing what (a sentence: what goes with it); without --yes and a terminal to
    ask on, or answered no, the command ends with exit status 2 and nothing done."""
    if yes:
        return
    if not interactive():
        raise NotConfirmed(f"{what}; stdin is not a terminal to ask on: give --yes to do it")
    if not click.confirm(f"{what}. Go on?", default=False, err=True):
        raise NotConfirmed("not confirmed: nothing done")


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
