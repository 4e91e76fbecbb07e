"""llmgw limits show|set: limits, budgets and model lists of organizations, teams, projects and
users (a key's own are `llmgw key limits`)."""

from __future__ import annotations

from typing import Any

import click
import msgspec

from llmgw.api_types import LevelIn, LevelView
from llmgw.cli.common import Settings, api_path, call, decoded, pass_settings
from llmgw.cli.limits import describe, limit_options, limits_body
from llmgw.cli.output import Listing, echo_json, json_option, listing_options


@click.group("limits")
def limits() -> None:
    """Limits, budgets and allowed models of organizations, teams, projects and users.

    Every level is enforced on every request, with the key's own: the strictest wins. A
    model with no price is never held back by a spend budget.
    """


def _level_options(f: Any) -> Any:
    for option in reversed(
        [
            click.option("--org", metavar="ORG", help="The organization (with --team or "
                         "--project: theirs)."),
            click.option("--team", metavar="TEAM", help="A team of --org."),
            click.option("--project", metavar="PROJECT", help="A project of --org."),
            click.option("--user", metavar="USER", help="A user (name or id; staff only)."),
        ]
    ):  # fmt: skip
        f = option(f)
    return f


def _path(org: str | None, team: str | None, project: str | None, user: str | None) -> str:
    """The API path of the one level the options name."""
    if user is not None and (org or team or project):
        raise click.UsageError("--user goes alone")
    if user is not None:
        return api_path("users", user, "limits")
    if org is None:
        raise click.UsageError("name a level: --org ORG [--team T | --project P], or --user U")
    if team is not None and project is not None:
        raise click.UsageError("--team or --project, not both")
    if team is not None:
        return api_path("orgs", org, "limits", "teams", team)
    if project is not None:
        return api_path("orgs", org, "limits", "projects", project)
    return api_path("orgs", org, "limits")


@limits.command("set")
@_level_options
@limit_options
@click.option(
    "--models",
    metavar="A,B,...",
    help="The only models it may use, comma-separated; '' allows every model again.",
)
@json_option
@pass_settings
def set_(
    settings: Settings,
    org: str | None,
    team: str | None,
    project: str | None,
    user: str | None,
    rpm: int | None,
    tpm: int | None,
    budget_tokens: tuple[int, str] | None,
    budget_spend: tuple[float, str] | None,
    models: str | None,
    as_json: bool,
) -> None:
    """Change a level's limits: the options not given stay as they are, 0 removes a limit.
    An organization's admin sets its own, its teams' and projects'; a staff admin any."""
    given = msgspec.structs.asdict(limits_body(rpm, tpm, budget_tokens, budget_spend))
    names = None if models is None else [m.strip() for m in models.split(",") if m.strip()]
    body = LevelIn(**given, models=names)
    answer = call(settings, "PATCH", _path(org, team, project, user), body)
    if as_json:
        echo_json(answer)
    else:
        click.echo(_line(decoded(answer, LevelView)))


@limits.command()
@_level_options
@listing_options
@pass_settings
def show(
    settings: Settings,
    org: str | None,
    team: str | None,
    project: str | None,
    user: str | None,
    out: Listing,
) -> None:
    """Show an organization's limits with its teams' and projects', or a user's."""
    if team is not None or project is not None:
        raise click.UsageError("show takes --org ORG (all its levels) or --user U")
    answer = call(settings, "GET", _path(org, None, None, user))
    if out.raw(answer):
        return
    # an organization's: it, then its teams' and projects'; a user's: the one level
    views = decoded(answer, list[LevelView]) if user is None else [decoded(answer, LevelView)]
    rows = [[v.level, describe(v.limits), ",".join(v.models) or "all"] for v in views]
    out.table(["LEVEL", "LIMITS", "MODELS"], rows, "No levels.")


def _line(view: LevelView) -> str:
    models = ", ".join(view.models) or "every model"
    return f"{view.level}: limits {describe(view.limits)}; {models}."
