"""llmgw usage: tokens, requests and spend by key, model, day, organization, team, project or
user."""

from __future__ import annotations

from urllib.parse import urlencode

import click

from llmgw.api_types import UsageReport, UsageRow
from llmgw.cli.common import API, Settings, api_path, call, decoded, pass_settings
from llmgw.cli.output import Listing, listing_options


@click.command()
@click.option(
    "--by",
    type=click.Choice(["key", "model", "day", "org", "team", "project", "user"]),
    default="key",
    show_default=True,
    help="What each line sums over.",
)
@click.option(
    "--since",
    metavar="YYYY-MM-DD",
    help="The first day counted (UTC; default: the first day of this month).",
)
@click.option("--org", metavar="ORG", help="Only the keys of this organization (its admins').")
@listing_options
@pass_settings
def usage(settings: Settings, by: str, since: str | None, org: str | None, out: Listing) -> None:
    """Show the usage of /v1: requests, prompt and completion tokens, and spend at the models'
    prices, summed by key, model, day, organization, team, project or user (a key's maker;
    "-": keys of none); counts not yet written to the store are included."""
    query = {"by": by, **({"since": since} if since else {})}
    path = api_path("orgs", org, "usage") if org else f"{API}/usage"
    answer = call(settings, "GET", f"{path}?{urlencode(query)}")
    if out.raw(answer):
        return
    report = decoded(answer, UsageReport)
    first = ["KEY", "NAME"] if by == "key" else [by.upper()]
    headers = [*first, "REQUESTS", "PROMPT", "COMPLETION", "TOTAL", "SPEND"]
    lines = [[*_group(row, by), *_counts(row)] for row in report.rows]
    if lines:
        lines.append(["total", *[""] * (len(first) - 1), *_counts(report.total)])
    out.table(headers, lines, f"No usage since {report.since}.")


def _group(row: UsageRow, by: str) -> list[str]:
    if by == "key":
        return [row.key or "-", row.name or "-"]
    return [getattr(row, by) or "-"]  # by: one of the grouping fields (click's choice)


def _counts(row: UsageRow) -> list[object]:
    return [
        row.requests,
        row.prompt_tokens,
        row.completion_tokens,
        row.total_tokens,
        f"{row.spend:.6f}".rstrip("0").rstrip("."),
    ]
