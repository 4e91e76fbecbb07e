"""`llmgw scim token` against a real admin API on a Unix socket: a new token each time, printed
alone on stdout (the note on stderr), the answer as JSON with --json."""

from __future__ import annotations

import json
from collections.abc import Callable

from click.testing import Result

from tests.llmgw.test_cli_people import cli  # noqa: F401 (the fixture)


def test_scim_token_prints_a_new_token_each_time(cli: Callable[..., Result]) -> None:  # noqa: F811
    first = cli("scim", "token")
    assert first.exit_code == 0, first.output
    assert first.stdout.strip().startswith("scim-llmgw-")
    assert "/scim/v2" in first.stderr and first.stdout.strip() not in first.stderr
    again = json.loads(cli("scim", "token", "--json").stdout)
    assert again["token"].startswith("scim-llmgw-") and again["token"] != first.stdout.strip()
