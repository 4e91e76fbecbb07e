"""llmgw key create|list|revoke: the API keys people and programs call /v1 with."""

from __future__ import annotations

import click

from llmgw.cli.common import API, Settings, api_path, call, pass_settings
from llmgw.cli.output import echo_json, echo_table, json_option, when


@click.group()
def key() -> None:
    """Make, list and revoke API keys."""


@key.command()
@click.argument("name")
@click.option("--admin", is_flag=True, help="An admin key: it may also use /api/v1.")
@json_option
@pass_settings
def create(settings: Settings, name: str, admin: bool, as_json: bool) -> None:
    """Make a new key called NAME and print it: this is the only time it is shown.

    The key alone goes to stdout (KEY=$(llmgw key create NAME) keeps it), the note to stderr.
    """
    body = {"name": name, "role": "admin" if admin else "user"}
    answer = call(settings, "POST", f"{API}/keys", body)
    if as_json:
        echo_json(answer)
        return
    click.echo(
        f"Created {answer['role']} key {answer['id']} ({answer['name']}). "
        "Store it now: it is not shown again.",
        err=True,
    )
    click.echo(answer["key"])


@key.command("list")
@json_option
@pass_settings
def list_(settings: Settings, as_json: bool) -> None:
    """List the keys (never the keys themselves): id, name, role, prefix, created, state."""
    answer = call(settings, "GET", f"{API}/keys")
    if as_json:
        echo_json(answer)
        return
    rows = [
        [
            k["id"],
            k["name"],
            k["role"],
            k["prefix"] + "...",
            when(k["created_at"]),
            "revoked" if k["revoked"] else "active",
        ]
        for k in answer
    ]
    headers = ["ID", "NAME", "ROLE", "PREFIX", "CREATED", "STATE"]
    echo_table(headers, rows, "No keys yet: make one with `llmgw key create NAME`.")


@key.command()
@click.argument("ident", metavar="ID")
@json_option
@pass_settings
def revoke(settings: Settings, ident: str, as_json: bool) -> None:
    """Revoke the key with this id (or the one live key with this name), at once."""
    answer = call(settings, "DELETE", api_path("keys", ident))
    if as_json:
        echo_json(answer)
    else:
        click.echo(f"Revoked key {answer['id']} ({answer['name']}).")
