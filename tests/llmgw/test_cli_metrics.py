"""`llmgw metrics token` against a real admin API on a Unix socket: a new scrape token each
time, printed alone on stdout (so `> FILE` is Prometheus' credentials file), the note on stderr,
the answer as JSON with --json."""

from __future__ import annotations

import json
from collections.abc import Callable

from click.testing import Result

from tests.llmgw.test_cli_people import cli  # noqa: F401 (the fixture)


def test_metrics_token_prints_a_new_token_each_time(cli: Callable[..., Result]) -> None:  # noqa: F811
    first = cli("metrics", "token")
    assert first.exit_code == 0, first.output
    made = first.stdout.strip()
    assert first.stdout == made + "\n" and made.startswith("metrics-llmgw-")
    assert "/metrics" in first.stderr and made not in first.stderr
    again = json.loads(cli("metrics", "token", "--json").stdout)
    assert again["token"].startswith("metrics-llmgw-") and again["token"] != made
    assert again["path"] == "/metrics"
