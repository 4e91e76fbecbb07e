"""llmgw model add|serve|stop|restart|price|remove and llmgw models: the model catalog (serve
and remove --wait until it is done)."""

from __future__ import annotations

from typing import Any, Literal, cast

import click

from llmgw.api_types import (
    MAX_CARDS_PER_REPLICA,
    ContextIn,
    Engine,
    MaxTokensIn,
    ModelIn,
    ModelRemoved,
    ModelView,
    PlanView,
    PriceIn,
    ProfileReplicasIn,
    ServeIn,
    SetStatus,
    Verdict,
)
from llmgw.cli import complete, progress, wait
from llmgw.cli.common import (
    API,
    NotFound,
    Refused,
    Settings,
    api_path,
    call,
    decoded,
    pass_settings,
)
from llmgw.cli.output import (
    Listing,
    confirm,
    echo_json,
    echo_table,
    json_option,
    listing_options,
    size,
    when,
    yes_option,
)
from llmgw.reply_time import slow


@click.group()
def model() -> None:
    """Add models to the catalog and say how many replicas of each to run."""


@model.command()
@click.argument("name")
@click.option(
    "--from",
    "source",
    required=True,
    metavar="SOURCE",
    help=(
        "Where the model is: hf:ORG/REPO[@REV][:PATTERN] (through the mirror, pinned to a "
        "commit; PATTERN picks files, e.g. '*Q4_K_M.gguf'), or file:/absolute/path.gguf, a "
        "file that exists on the nodes."
    ),
)
@click.option(
    "--engine",
    type=click.Choice(["llama.cpp", "vllm", "freetoken"]),
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
@click.option(
    "--no-wait",
    is_flag=True,
    help="With hf:, return once pinned instead of showing the mirror's fetch to its end.",
)
@click.option(
    "--on-demand",
    is_flag=True,
    help="Start it on its first request (which waits for it) and park it when idle.",
)
@click.option(
    "--idle",
    "idle_s",
    type=click.IntRange(min=1),
    default=300,
    show_default=True,
    metavar="SECONDS",
    help="With --on-demand: park it after this long without a request.",
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
    no_wait: bool,
    on_demand: bool,
    idle_s: int,
    as_json: bool,
) -> None:
    """Add model NAME to the catalog; it is not served until `llmgw model serve` (an
    on-demand model: until its first request). An hf: source is pinned to a commit and
    fetched by the mirror; its progress is shown until the whole set is there."""
    body = ModelIn(
        name=name,
        source=source,
        engine=cast(Engine, engine),  # a click.Choice of Engine's
        args=list(args),
        context=context,
        max_tokens=max_tokens,
        on_demand=on_demand,
        idle_s=idle_s,
    )
    raw = call(settings, "POST", f"{API}/models", body)
    added = decoded(raw, ModelView)
    if added.mirror is not None and not no_wait:
        last = progress.follow(lambda: _mirror_of(settings, name))
        if last is not None and last.state == "failed":
            raise Refused(f"the mirror could not fetch {added.source}: {last.error}")
        raw = call(settings, "GET", api_path("models", name))
    if as_json:
        echo_json(raw)
        return
    answer = decoded(raw, ModelView)
    if answer.source.startswith("hf:"):
        click.echo(f"Pinned {answer.source}: {answer.files} files, {size(answer.bytes)}.")
    if on_demand:
        click.echo(f"Added model {name}, on demand: its first request starts it.")
    else:
        click.echo(f"Added model {name}. Serve it with: llmgw model serve {name} --replicas 1")
    if answer.shape_note:
        click.echo(f"Note: {answer.shape_note}.")


def _mirror_of(settings: Settings, name: str) -> SetStatus | None:
    """The mirror's fetch of model NAME's set, as GET /models/{name} has it now."""
    return decoded(call(settings, "GET", api_path("models", name)), ModelView).mirror


def _summary(answer: Any) -> str:
    m = decoded(answer, ModelView)
    return f"model {m.name}: {m.replicas} replicas wanted, {m.ready} ready"


@model.command()
@click.argument("name", shell_complete=complete.models)
@click.option(
    "--replicas", type=click.IntRange(min=0), required=True, help="How many replicas to run."
)
@click.option(
    "--cpu-ok",
    is_flag=True,
    help="Serve it though a reply would take minutes on the CPUs placement would use.",
)
@wait.wait_options
@json_option
@pass_settings
def serve(
    settings: Settings,
    name: str,
    replicas: int,
    cpu_ok: bool,
    wait_done: bool,
    wait_timeout: float,
    as_json: bool,
) -> None:
    """Run N replicas of model NAME; the scheduler places them on nodes. Where a reply would
    take minutes (`llmgw model plan` says so), only with --cpu-ok. With --wait, until N are
    ready and no other is starting or stopping."""
    if replicas and not cpu_ok:
        _refuse_slow(settings, name, None)
    answer = call(settings, "POST", api_path("models", name, "serve"), ServeIn(replicas=replicas))
    if as_json:
        echo_json(answer)
    else:
        click.echo(_summary(answer))
    if wait_done:
        wait.wait_served(settings, name, wait_timeout)


def _refuse_slow(settings: Settings, name: str, profile: str | None) -> None:
    """Refuse to serve model NAME (on one profile, or any) where its plan says a reply takes
    minutes on CPUs (the console's serve form asks first by the same rule); a plan not read,
    or a profile not in it yet, says nothing."""
    try:
        plan = decoded(call(settings, "GET", api_path("models", name, "plan")), PlanView)
    except (Refused, NotFound):
        return  # no scheduler here, or no such model: the serve call says
    late = [b for b in slow(plan, plan.max_tokens) if profile in (None, b.profile)]
    if late:
        raise Refused(f"{late[0].warning()}: serve it with --cpu-ok to serve it anyway")


@model.command()
@click.argument("name", shell_complete=complete.models)
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
@click.argument("name", shell_complete=complete.models)
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
    body = PriceIn(prompt=prompt, completion=completion)
    answer = call(settings, "PUT", api_path("models", name, "price"), body)
    if as_json:
        echo_json(answer)
    else:
        m = decoded(answer, ModelView)
        click.echo(
            f"Model {name}: {m.price_prompt:g} per million prompt tokens, "
            f"{m.price_completion:g} per million completion tokens."
        )


@model.command()
@click.argument("name", shell_complete=complete.models)
@click.option(
    "--files",
    is_flag=True,
    help="Also delete its files that no other model uses, from the mirror and the nodes.",
)
@yes_option
@wait.wait_options
@json_option
@pass_settings
def remove(
    settings: Settings,
    name: str,
    files: bool,
    yes: bool,
    wait_done: bool,
    wait_timeout: float,
    as_json: bool,
) -> None:
    """Take model NAME out of the catalog; its replicas are stopped. With --files it asks
    first, unless --yes. With --wait, until no node runs a replica of it."""
    if files:
        confirm(yes, f"Removing model {name} with --files deletes its files from the nodes")
    path = api_path("models", name) + ("?files=true" if files else "")
    answer = call(settings, "DELETE", path)
    if as_json:
        echo_json(answer)
    else:
        _removed(name, decoded(answer, ModelRemoved))
    if wait_done:
        wait.wait_gone(settings, name, wait_timeout)


def _removed(name: str, removed: ModelRemoved) -> None:
    swept = removed.files
    click.echo(f"Removed model {name}.")
    if swept is not None:
        click.echo(f"mirror: {swept.files} files deleted, {size(swept.bytes)} freed")
        for n in swept.nodes:
            if not n.answered:
                click.echo(f"{n.node}: did not list its files again; run llmgw mirror sweep")
            else:
                click.echo(f"{n.node}: {n.files} files deleted, {size(n.bytes)} freed")


@model.command()
@click.argument("name", shell_complete=complete.models)
@click.argument("count", type=click.IntRange(min=0))
@click.option(
    "--profile", required=True, help="The profile (made if new: gpu* on cards, else CPUs)."
)
@click.option("--kind", type=click.Choice(["cpu", "gpu"]), help="A new profile's kind.")
@click.option("--priority", type=int, help="The router fills higher priorities first.")
@click.option(
    "--gpus",
    type=click.IntRange(1, MAX_CARDS_PER_REPLICA),
    help="A gpu profile's cards a replica, the model split across them.",
)
@click.option(
    "--cpu-ok",
    is_flag=True,
    help="Run them though a reply would take minutes on the profile's CPUs.",
)
@json_option
@pass_settings
def replicas(
    settings: Settings,
    name: str,
    count: int,
    profile: str,
    kind: str | None,
    priority: int | None,
    gpus: int | None,
    cpu_ok: bool,
    as_json: bool,
) -> None:
    """Run COUNT replicas of model NAME's profile; new ones start before old ones stop.
    Where the plan says a reply takes minutes on the profile's CPUs, only with --cpu-ok."""
    if count and not cpu_ok:
        _refuse_slow(settings, name, profile)
    # kind "", priority and gpus None: a new profile's defaults, an existing one's kept
    new_kind = cast(Literal["", "cpu", "gpu"], kind or "")
    body = ProfileReplicasIn(
        profile=profile, replicas=count, kind=new_kind, priority=priority, gpus=gpus
    )
    answer = call(settings, "POST", api_path("models", name, "replicas"), body)
    if as_json:
        echo_json(answer)
    else:
        click.echo(f"{_summary(answer)}; profile {profile}: {count}")


@model.command()
@click.argument("name", shell_complete=complete.models)
@click.argument("tokens", type=click.IntRange(min=0), required=False)
@click.option(
    "--max-output",
    type=click.IntRange(min=0),
    metavar="TOKENS",
    help="The longest answer a request may ask for (0: the context); alone it restarts "
    "nothing, as `llmgw model max-tokens`.",
)
@json_option
@pass_settings
def context(
    settings: Settings, name: str, tokens: int | None, max_output: int | None, as_json: bool
) -> None:
    """Give model NAME's replicas a context of TOKENS (0: as trained, where it fits): they
    are replaced one at a time to take it, as by `llmgw model restart`. With --max-output,
    the longest answer is set with it (never past it); --max-output alone changes only
    that, and no replica starts again."""
    if tokens is None:
        if max_output is None:
            raise click.UsageError("give TOKENS, --max-output, or both")
        _set_max_tokens(settings, name, max_output, as_json)
        return
    body = ContextIn(context=tokens, max_tokens=max_output)
    answer = call(settings, "PUT", api_path("models", name, "context"), body)
    if as_json:
        echo_json(answer)
        return
    click.echo(f"Model {name}: context {tokens or 'as trained'}.")
    if max_output is not None:
        _echo_longest(name, max_output)
    _echo_rollout(answer)


@model.command("max-tokens")
@click.argument("name", shell_complete=complete.models)
@click.argument("tokens", type=click.IntRange(min=0))
@json_option
@pass_settings
def max_tokens(settings: Settings, name: str, tokens: int, as_json: bool) -> None:
    """Let a request to model NAME ask for at most TOKENS of answer (0: its context); its
    next requests are bound by it, with no replica started again."""
    _set_max_tokens(settings, name, tokens, as_json)


def _set_max_tokens(settings: Settings, name: str, tokens: int, as_json: bool) -> None:
    """PUT /models/{name}/max_tokens: what `model max-tokens` and `model context
    --max-output` alone send."""
    body = MaxTokensIn(max_tokens=tokens)
    answer = call(settings, "PUT", api_path("models", name, "max_tokens"), body)
    if as_json:
        echo_json(answer)
    else:
        _echo_longest(name, tokens)


def _echo_longest(name: str, tokens: int) -> None:
    longest = f"{tokens} tokens" if tokens else "its context"
    click.echo(f"Model {name}: longest answer {longest}.")


@model.command()
@click.argument("name", shell_complete=complete.models)
@json_option
@pass_settings
def restart(settings: Settings, name: str, as_json: bool) -> None:
    """Start every replica of model NAME again, one at a time: a new one beside an old one
    where placement has room (as many ready as wanted throughout), else an old one stopped
    first (one fewer; a model with one replica and no room restarts in place). A new one
    that fails to start halts it, the old ones kept (`llmgw models` says why)."""
    answer = call(settings, "POST", api_path("models", name, "restart"))
    if as_json:
        echo_json(answer)
    else:
        click.echo(f"Restarting {_summary(answer)}.")
        _echo_rollout(answer)


def _echo_rollout(answer: Any) -> None:
    """The replicas' roll to the new settings, where one runs."""
    rollout = decoded(answer, ModelView).rollout
    if rollout:
        click.echo(f"New settings: {rollout}.")


def _verdict_row(v: Verdict) -> list[Any]:
    fits = "fits" if v.fits else "no"
    memory = size(v.memory_bytes) if v.fits else ""
    speed = f"{v.tokens_per_s:.0f}" if v.tokens_per_s else ""
    slots = (v.slots or "") if v.fits else ""
    return [v.node, v.place or "-", fits, v.context or "", slots, memory, speed, v.reason]


@model.command()
@click.argument("name", shell_complete=complete.models)
@click.option(
    "--from",
    "source",
    metavar="SOURCE",
    help="For a model not added yet: where it would come from, as `llmgw model add "
    "--from` takes it (nothing is added or fetched; an hf: set the mirror has not fetched "
    "is planned by count).",
)
@click.option(
    "--engine",
    type=click.Choice(["llama.cpp", "vllm", "freetoken"]),
    default="llama.cpp",
    show_default=True,
    help="With --from: the engine that would serve it.",
)
@click.option(
    "--context",
    type=click.IntRange(min=0),
    default=0,
    help="With --from: its context length in tokens (default: the engine's).",
)
@json_option
@pass_settings
def plan(
    settings: Settings, name: str, source: str | None, engine: str, context: int, as_json: bool
) -> None:
    """Say where each replica of model NAME is, and where one more would go or why not:
    per node and card, the memory it takes, the context that fits, its slots (requests at
    once, each with that context: as many as fit beside the weights, up to four), and
    tokens/s on CPUs.
    With --from, where model NAME would go were it added from SOURCE."""
    if source is None:
        if engine != "llama.cpp" or context:
            raise click.UsageError("--engine and --context go with --from")
        answer = call(settings, "GET", api_path("models", name, "plan"))
    else:
        body = ModelIn(name=name, source=source, engine=cast(Engine, engine), context=context)
        answer = call(settings, "POST", f"{API}/models/plan", body)
    if as_json:
        echo_json(answer)
        return
    view = decoded(answer, PlanView)
    if not view.estimates:
        click.echo(f"No estimates: {view.note}.")
    if view.parked:
        click.echo("Parked (on demand): its next request starts it.")
    if view.failed_on:
        click.echo(f"Failed to start on: {', '.join(view.failed_on)}.")
    for p in view.profiles:
        click.echo(
            f"Profile {p.name} ({p.kind}, priority {p.priority}): "
            f"{len(p.placed)} of {p.replicas} replicas placed"
        )
        for r in p.placed:
            on = f" on {', '.join(r.devices)}" if r.devices else ""
            slots = f"{r.slots} slots" if r.slots else "the engine's slots"
            click.echo(
                f"  {r.id}: node {r.node}{on}, context {r.context or 'default'}, {slots}, "
                f"memory {r.memory}"
            )
        headers = ["NODE", "PLACE", "FITS", "CONTEXT", "SLOTS", "MEMORY", "TOKENS/S", "WHY"]
        echo_table(headers, [_verdict_row(v) for v in p.verdicts], "  No nodes.")
    for b in slow(view, view.max_tokens):
        click.echo(f"Warning: {b.warning()}: `llmgw model serve` asks for --cpu-ok.")


def status_of(m: ModelView) -> str:
    """One word (and the first failure's reason) for how a model is doing."""
    if m.source.startswith("upstream:"):
        return "external"  # served by its provider's API (llmgw providers)
    reps = m.replica_status
    ooms = sum(r.oom_kills for r in reps)
    also = f" ({ooms} OOM kill{'s' if ooms != 1 else ''})" if ooms else ""
    failed = [r for r in reps if r.state == "failed"]
    if failed:
        word = "out of memory" if failed[0].reason == "oom" else "failed"
        return (f"{word}: {failed[0].message}" if failed[0].message else word) + also
    if m.parked:
        return "stopping (parking)" if reps else "parked"
    if m.rollout and m.replicas:
        halted = m.rollout.startswith("halted")
        return (f"roll {m.rollout}" if halted else "rolling to new settings") + also
    if m.replicas == 0:
        return ("stopping" if reps else "stopped") + also
    return ("ready" if m.ready >= m.replicas else "starting") + also


def _wide(m: ModelView) -> list[object]:
    """The columns -o wide adds: longest answer, price, on demand, files, added."""
    price = (
        f"{m.price_prompt:g}/{m.price_completion:g}"
        if m.price_prompt or m.price_completion
        else "-"
    )
    demand = f"idle {m.idle_s}s" if m.on_demand else "no"
    files = f"{m.files} ({size(m.bytes)})" if m.files else "-"
    return [m.max_tokens or "context", price, demand, files, when(m.created_at)]


@click.command()
@listing_options
@pass_settings
def models(settings: Settings, out: Listing) -> None:
    """List the models and how their replicas are doing.

    One line a model: engine, replicas ready of wanted, context length, status (stopped,
    starting, ready, stopping, parked for an on-demand model without requests, rolling to
    new settings after a restart or a context change, its roll halted with why, or failed
    with the first failure's reason), the replicas wanted on each profile (cards and CPUs
    under one name: "gpu 7, cpu 4") and source; -o wide adds the longest answer in tokens,
    the price per million prompt/completion tokens, whether it runs on demand, its files
    and when it was added.
    """
    answer = call(settings, "GET", f"{API}/models")
    if out.raw(answer):
        return
    rows = [
        [
            m.name,
            m.engine,
            f"{m.ready}/{m.replicas}",
            m.context or "default",
            status_of(m),
            _per_profile(m),
            m.source,
            *_wide(m),
        ]
        for m in decoded(answer, list[ModelView])
    ]
    headers = ["NAME", "ENGINE", "READY", "CONTEXT", "STATUS", "REPLICAS", "SOURCE"]
    headers += ["MAX TOKENS", "PRICE", "ON DEMAND", "FILES", "ADDED"]
    out.table(headers, rows, "No models yet: add one with `llmgw model add`.", shown=7)


def _per_profile(m: ModelView) -> str:
    """The replicas wanted on each profile: "gpu 7, cpu 4" (highest priority first)."""
    ordered = sorted(m.profiles, key=lambda p: -p.priority)
    return ", ".join(f"{p.name} {p.replicas}" for p in ordered) or "-"
