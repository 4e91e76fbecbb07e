"""llmgw key create|limits|revoke and llmgw keys: the API keys people and programs call /v1
with."""

from __future__ import annotations

import click

from llmgw.api_types import KeyIn, KeyView, NewKey
from llmgw.cli import complete
from llmgw.cli.common import API, Settings, api_path, call, decoded, pass_settings
from llmgw.cli.limits import describe, limit_options, limits_body
from llmgw.cli.output import Listing, echo_json, json_option, listing_options, when


@click.group()
def key() -> None:
    """Make, list and revoke API keys, and set what each may use."""


@key.command()
@click.argument("name")
@click.option("--admin", is_flag=True, help="An admin key: it may also use /api/v1.")
@limit_options
@json_option
@pass_settings
def create(
    settings: Settings,
    name: str,
    admin: bool,
    rpm: int | None,
    tpm: int | None,
    budget_tokens: tuple[int, str] | None,
    budget_spend: tuple[float, str] | None,
    as_json: bool,
) -> None:
    """Make a new key called NAME and print it: this is the only time it is shown.

    The key alone goes to stdout (KEY=$(llmgw key create NAME) keeps it), the note to stderr.
    Without limit options the key has no limits; `llmgw key limits` changes them later.
    """
    body = KeyIn(
        name=name,
        role="admin" if admin else "user",
        limits=limits_body(rpm, tpm, budget_tokens, budget_spend),
    )
    answer = call(settings, "POST", f"{API}/keys", body)
    if as_json:
        echo_json(answer)
        return
    new = decoded(answer, NewKey)
    click.echo(
        f"Created {new.role} key {new.id} ({new.name}). Store it now: it is not shown again.",
        err=True,
    )
    click.echo(new.key)


@click.command()
@listing_options
@pass_settings
def keys(settings: Settings, out: Listing) -> None:
    """List the keys (never the keys themselves): id, name, role, prefix, created, state and
    limits."""
    answer = call(settings, "GET", f"{API}/keys")
    if out.raw(answer):
        return
    rows = [
        [
            k.id,
            k.name,
            k.role,
            k.prefix + "...",
            when(k.created_at),
            "revoked" if k.revoked else "active",
            describe(k.limits),
        ]
        for k in decoded(answer, list[KeyView])
    ]
    headers = ["ID", "NAME", "ROLE", "PREFIX", "CREATED", "STATE", "LIMITS"]
    out.table(headers, rows, "No keys yet: make one with `llmgw key create NAME`.")


@key.command()
@click.argument("ident", metavar="ID", shell_complete=complete.keys)
@json_option
@pass_settings
def revoke(settings: Settings, ident: str, as_json: bool) -> None:
    """Revoke the key with this id (or the one live key with this name), at once."""
    answer = call(settings, "DELETE", api_path("keys", ident))
    if as_json:
        echo_json(answer)
    else:
        gone = decoded(answer, KeyView)
        click.echo(f"Revoked key {gone.id} ({gone.name}).")


@key.command()
@click.argument("ident", metavar="ID", shell_complete=complete.keys)
@limit_options
@json_option
@pass_settings
def limits(
    settings: Settings,
    ident: str,
    rpm: int | None,
    tpm: int | None,
    budget_tokens: tuple[int, str] | None,
    budget_spend: tuple[float, str] | None,
    as_json: bool,
) -> None:
    """Change the limits of key ID (or of the one live key named so); the options not given
    stay as they are, 0 removes a limit, and with no option the limits are shown."""
    body = limits_body(rpm, tpm, budget_tokens, budget_spend)
    answer = call(settings, "PATCH", api_path("keys", ident, "limits"), body)
    if as_json:
        echo_json(answer)
    else:
        k = decoded(answer, KeyView)
        click.echo(f"Key {k.id} ({k.name}): limits {describe(k.limits)}.")
