"""llmgw provider add|remove and llmgw providers: models served by an external provider's API
(OpenAI-compatible or Anthropic), under the cluster's keys, limits, budgets and usage."""

from __future__ import annotations

import sys

import click

from llmgw.api_types import ProviderIn, ProviderRemoved, ProviderView
from llmgw.cli.common import API, Refused, Settings, api_path, call, decoded, pass_settings
from llmgw.cli.output import Listing, echo_json, json_option, listing_options


@click.group("provider")
def provider() -> None:
    """Models served by an external provider's API (staff admins)."""


def read_credential(path: str) -> str:
    """The credential: the first line of the file at path ("-": standard input)."""
    try:
        if path == "-":
            line = sys.stdin.readline()
        else:
            with open(path, encoding="utf-8") as f:
                line = f.readline()
    except OSError as e:
        raise Refused(f"cannot read the credential file: {e.strerror}") from None
    credential = line.strip()
    if not credential:
        raise Refused("the credential file's first line is empty")
    return credential


@provider.command("add")
@click.argument("name")
@click.option(
    "--protocol",
    type=click.Choice(["openai", "anthropic"]),
    required=True,
    help="The upstream's API: OpenAI's (and compatible ones) or Anthropic's.",
)
@click.option(
    "--url",
    required=True,
    metavar="URL",
    help="The API's base, with its /v1: https://api.openai.com/v1.",
)
@click.option(
    "--model",
    "upstream_model",
    required=True,
    metavar="MODEL",
    help="The upstream's name of the model (gpt-4o-mini, claude-sonnet-4-5).",
)
@click.option(
    "--credential-file",
    required=True,
    metavar="PATH",
    help="A file whose first line is the upstream's key ('-': standard input).",
)
@click.option(
    "--context",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="The model's context in tokens, which requests are checked against (0: unknown).",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="The most completion tokens a request may ask (0: the context's).",
)
@json_option
@pass_settings
def add(settings: Settings, name: str, protocol: str, url: str, upstream_model: str,
        credential_file: str, context: int, max_tokens: int, as_json: bool) -> None:  # fmt: skip
    """Add model NAME, served by an external provider's API.

    Clients ask for NAME on /v1 with their llmgw keys, under their limits, budgets and model
    lists, as for a local model; the upstream's reported usage is what is counted (set a
    price with `llmgw model price`). The credential is sealed with a key of the cluster's
    secret and is never shown, logged or returned; it is read from a file, never an argument.
    Requests go to URL alone: no request body chooses another. Remove with `llmgw provider
    remove NAME`.
    """
    body = ProviderIn(
        name=name, protocol="anthropic" if protocol == "anthropic" else "openai", url=url,
        model=upstream_model, credential=read_credential(credential_file), context=context,
        max_tokens=max_tokens,
    )  # fmt: skip
    answer = call(settings, "POST", f"{API}/providers", body)
    if as_json:
        echo_json(answer)
        return
    made = decoded(answer, ProviderView)
    click.echo(f"Model {made.name} added: {made.protocol} API at {made.url}, model {made.model}.")


@provider.command("remove")
@click.argument("name")
@json_option
@pass_settings
def remove(settings: Settings, name: str, as_json: bool) -> None:
    """Remove external provider model NAME, its sealed credential with it."""
    answer = call(settings, "DELETE", api_path("providers", name))
    if as_json:
        echo_json(answer)
        return
    click.echo(f"Model {decoded(answer, ProviderRemoved).name} removed.")


@click.command("providers")
@listing_options
@pass_settings
def providers(settings: Settings, out: Listing) -> None:
    """List the models served by external providers: their API, address and upstream model
    (never their credentials). -o wide adds context, max tokens and prices."""
    answer = call(settings, "GET", f"{API}/providers")
    if out.raw(answer):
        return
    rows = [
        [p.name, p.protocol, p.url, p.model, p.context or "-", p.max_tokens or "-",
         f"{p.price_prompt:g}/{p.price_completion:g}"]
        for p in decoded(answer, list[ProviderView])
    ]  # fmt: skip
    headers = ["NAME", "API", "URL", "MODEL", "CONTEXT", "MAX TOKENS", "PRICE (PROMPT/COMPL.)"]
    out.table(headers, rows, "No model is served by an external provider.", shown=4)
