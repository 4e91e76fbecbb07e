"""What `llmgw scim token` and `llmgw metrics token` share: a new stored token made, printed
alone on stdout (a note on stderr, so `> FILE` keeps the token only), or the answer as JSON."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import click

from llmgw.cli.common import Settings, api_path, call, decoded
from llmgw.cli.output import echo_json


class Made(Protocol):
    """An answer with a new token in it."""

    @property
    def token(self) -> str: ...


M = TypeVar("M", bound=Made)


def new_token(settings: Settings, as_json: bool, what: str, kind: type[M],
              note: Callable[[M], str]) -> None:  # fmt: skip
    """POST /api/v1/WHAT/token; the token on stdout and note on stderr, or the JSON answer."""
    answer = call(settings, "POST", api_path(what, "token"), {})
    if as_json:
        echo_json(answer)
        return
    made = decoded(answer, kind)
    click.echo(made.token)
    click.echo(note(made), err=True)
