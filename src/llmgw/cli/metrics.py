"""llmgw metrics token: the bearer token Prometheus scrapes /metrics and /metrics/engines with."""

from __future__ import annotations

import click

from llmgw.api_types import MetricsTokenView
from llmgw.cli.bearer import new_token
from llmgw.cli.common import Settings, pass_settings
from llmgw.cli.output import json_option


@click.group()
def metrics() -> None:
    """Prometheus' access to /metrics and /metrics/engines on the client port."""


def _note(made: MetricsTokenView) -> str:
    return (
        f"Give it to Prometheus as the bearer credential of https://HOST:PORT{made.path} and "
        f"{made.path}/engines (the client port; see llmgwd(8)); it reads nothing else and is "
        "not shown again."
    )


@metrics.command()
@json_option
@pass_settings
def token(settings: Settings, as_json: bool) -> None:
    """Make a new scrape token for /metrics and /metrics/engines (shown once; the old one
    stops working). It reads the metrics only: no /v1, no /api/v1."""
    new_token(settings, as_json, "metrics", MetricsTokenView, _note)
