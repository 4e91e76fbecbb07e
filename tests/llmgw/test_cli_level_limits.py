"""`llmgw limits set|show` against a real admin API on a Unix socket (a staff admin)."""

from __future__ import annotations

import json
from collections.abc import Callable

from click.testing import Result

from tests.llmgw.test_cli_people import _ok, cli  # noqa: F401 (cli: a fixture)


def test_limits_set_and_shown_at_each_level(cli: Callable[..., Result]) -> None:  # noqa: F811
    _ok(cli("org", "create", "acme"))
    _ok(cli("org", "team", "acme", "ml"))
    _ok(cli("org", "project", "acme", "chat", "--team", "ml"))
    _ok(cli("user", "create", "ann"))
    out = _ok(cli("limits", "set", "--org", "acme", "--rpm", "600", "--budget-spend", "20/month"))
    assert out == "org:acme: limits 600 rpm, 20 spend/month; every model.\n"
    out = _ok(cli("limits", "set", "--org", "acme", "--team", "ml", "--tpm", "5000"))
    assert out.startswith("team:acme:ml: limits 5000 tpm;")
    out = _ok(cli("limits", "set", "--org", "acme", "--project", "chat", "--budget-tokens", "9"))
    assert out.startswith("project:acme:chat: limits 9 tokens/day;")
    out = _ok(cli("limits", "set", "--user", "ann", "--rpm", "5"))
    assert ": limits 5 rpm;" in out and out.startswith("user:")
    shown = _ok(cli("limits", "show", "--org", "acme"))
    assert "600 rpm, 20 spend/month" in shown and "5000 tpm" in shown and "9 tokens/day" in shown
    views = json.loads(_ok(cli("limits", "show", "--org", "acme", "--json")))
    assert [v["level"] for v in views] == ["org:acme", "team:acme:ml", "project:acme:chat"]
    out = _ok(cli("limits", "set", "--org", "acme", "--rpm", "0"))
    assert out == "org:acme: limits 20 spend/month; every model.\n"  # 0 removed it


def test_limits_set_names_one_level(cli: Callable[..., Result]) -> None:  # noqa: F811
    assert cli("limits", "set", "--rpm", "1").exit_code == 2
    assert cli("limits", "set", "--org", "a", "--user", "b", "--rpm", "1").exit_code == 2
    assert cli("limits", "set", "--org", "a", "--team", "t", "--project", "p").exit_code == 2
    r = cli("limits", "set", "--org", "nope", "--rpm", "1")
    assert r.exit_code != 0 and "nope" in r.output
