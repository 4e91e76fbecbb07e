"""llmgw model add|serve|stop|price|remove and llmgw models: the model catalog."""

from __future__ import annotations

from typing import Any

import click

from llmgw.cli.common import API, Settings, api_path, call, pass_settings
from llmgw.cli.output import echo_json, echo_table, json_option


@click.group()
def model() -> None:
    """Add models to the catalog and say how many replicas of each to run."""


@model.command()
@click.argument("name")
@click.option(
    "--from",
    "source",
    required=True,
    metavar="file:PATH",
    help="Where the model is: file:/absolute/path.gguf, a file that exists on the nodes.",
)
@click.option(
    "--engine",
    type=click.Choice(["llama.cpp"]),
    default="llama.cpp",
    show_default=True,
    help="The engine that serves it.",
)
@click.option(
    "--arg", "args", multiple=True, metavar="ARG", help="An extra engine argument (repeatable)."
)
@click.option(
    "--context",
    type=click.IntRange(min=0),
    default=0,
    help="Context length in tokens (default: the engine's).",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=0),
    default=0,
    help="The most completion tokens a request may ask for (default: the context).",
)
@json_option
@pass_settings
def add(
    settings: Settings,
    name: str,
    source: str,
    engine: str,
    args: tuple[str, ...],
    context: int,
    max_tokens: int,
    as_json: bool,
) -> None:
    """Add model NAME to the catalog; it is not served until `llmgw model serve`."""
    body = {
        "name": name,
        "source": source,
        "engine": engine,
        "args": list(args),
        "context": context,
        "max_tokens": max_tokens,
    }
    answer = call(settings, "POST", f"{API}/models", body)
    if as_json:
        echo_json(answer)
    else:
        click.echo(f"Added model {name}. Serve it with: llmgw model serve {name} --replicas 1")


def _summary(m: dict[str, Any]) -> str:
    return f"model {m['name']}: {m['replicas']} replicas wanted, {m['ready']} ready"


@model.command()
@click.argument("name")
@click.option(
    "--replicas", type=click.IntRange(min=0), required=True, help="How many replicas to run."
)
@json_option
@pass_settings
def serve(settings: Settings, name: str, replicas: int, as_json: bool) -> None:
    """Run N replicas of model NAME; the scheduler places them on nodes."""
    answer = call(settings, "POST", api_path("models", name, "serve"), {"replicas": replicas})
    if as_json:
        echo_json(answer)
    else:
        click.echo(_summary(answer))


@model.command()
@click.argument("name")
@json_option
@pass_settings
def stop(settings: Settings, name: str, as_json: bool) -> None:
    """Stop every replica of model NAME (it stays in the catalog)."""
    answer = call(settings, "POST", api_path("models", name, "stop"))
    if as_json:
        echo_json(answer)
    else:
        click.echo(f"Stopping model {name}: 0 replicas wanted.")


@model.command()
@click.argument("name")
@click.option(
    "--prompt", type=click.FloatRange(min=0), required=True, help="Per million prompt tokens."
)
@click.option(
    "--completion",
    type=click.FloatRange(min=0),
    required=True,
    help="Per million completion tokens.",
)
@json_option
@pass_settings
def price(settings: Settings, name: str, prompt: float, completion: float, as_json: bool) -> None:
    """Set what model NAME costs, per million tokens, in the currency of the keys' budgets."""
    body = {"prompt": prompt, "completion": completion}
    answer = call(settings, "PUT", api_path("models", name, "price"), body)
    if as_json:
        echo_json(answer)
    else:
        click.echo(
            f"Model {name}: {answer['price_prompt']:g} per million prompt tokens, "
            f"{answer['price_completion']:g} per million completion tokens."
        )


@model.command()
@click.argument("name")
@json_option
@pass_settings
def remove(settings: Settings, name: str, as_json: bool) -> None:
    """Take model NAME out of the catalog; its replicas are stopped."""
    answer = call(settings, "DELETE", api_path("models", name))
    if as_json:
        echo_json(answer)
    else:
        click.echo(f"Removed model {name}.")


def status_of(m: dict[str, Any]) -> str:
    """One word (and the first failure's reason) for how a model is doing."""
    reps = m.get("replica_status", [])
    failed = [r for r in reps if r["state"] == "failed"]
    if failed:
        return f"failed: {failed[0]['message']}" if failed[0]["message"] else "failed"
    if m["replicas"] == 0:
        return "stopping" if reps else "stopped"
    return "ready" if m["ready"] >= m["replicas"] else "starting"


@click.command()
@json_option
@pass_settings
def models(settings: Settings, as_json: bool) -> None:
    """List the models and how their replicas are doing.

    One line a model: engine, replicas ready of wanted, context length, status (stopped,
    starting, ready, stopping, or failed with the first failure's reason) and source.
    """
    answer = call(settings, "GET", f"{API}/models")
    if as_json:
        echo_json(answer)
        return
    rows = [
        [
            m["name"],
            m["engine"],
            f"{m['ready']}/{m['replicas']}",
            m["context"] or "default",
            status_of(m),
            m["source"],
        ]
        for m in answer
    ]
    headers = ["NAME", "ENGINE", "READY", "CONTEXT", "STATUS", "SOURCE"]
    echo_table(headers, rows, "No models yet: add one with `llmgw model add`.")
