"""llmgw key create/limits with limits, llmgw model price, and llmgw usage, against the real
admin API of test_cli's daemon fixture."""

from __future__ import annotations

import json

import pytest

from tests.llmgw.test_cli import Daemon, daemon, rows  # noqa: F401 (daemon: a fixture)


def test_key_limits_are_set_changed_and_listed(daemon: Daemon) -> None:  # noqa: F811
    r = daemon.cli("key", "create", "alice", "--rpm", "60", "--budget-tokens", "100000/month")
    assert r.exit_code == 0, r.output
    [key] = daemon.catalog.keys()
    assert (key.limits.rpm, key.limits.budget_tokens, key.limits.budget_tokens_per) == (
        60,
        100000,
        "month",
    )
    r = daemon.cli("key", "limits", "alice", "--tpm", "5000", "--budget-spend", "2.5", "--rpm", "0")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == (
        f"Key {key.id} (alice): limits 5000 tpm, 100000 tokens/month, 2.5 spend/day."
    )
    header, row = rows(daemon.cli("key", "list").stdout)
    assert header[-1] == "LIMITS"
    assert row[-1] == "5000 tpm, 100000 tokens/month, 2.5 spend/day"
    [listed] = json.loads(daemon.cli("key", "list", "--json").stdout)
    assert listed["limits"]["budget_spend"] == 2.5


@pytest.mark.parametrize("budget", ["lots/day", "5/week", "-1/day"])
def test_a_bad_budget_is_a_usage_error(daemon: Daemon, budget: str) -> None:  # noqa: F811
    r = daemon.cli("key", "create", "bob", "--budget-tokens", budget)
    assert r.exit_code == 2
    assert "AMOUNT/day or AMOUNT/month" in r.output
    assert daemon.catalog.keys() == []


def test_limits_of_an_unknown_key_exits_4(daemon: Daemon) -> None:  # noqa: F811
    assert daemon.cli("key", "limits", "nope", "--rpm", "1").exit_code == 4


def test_model_price_and_max_tokens(daemon: Daemon) -> None:  # noqa: F811
    r = daemon.cli("model", "add", "smol", "--from", "file:/m/smol.gguf", "--context", "4096",
                   "--max-tokens", "1024")  # fmt: skip
    assert r.exit_code == 0, r.output
    r = daemon.cli("model", "price", "smol", "--prompt", "0.25", "--completion", "1")
    assert r.exit_code == 0, r.output
    assert "0.25 per million prompt tokens, 1 per million completion tokens" in r.stdout
    model = daemon.catalog.get("smol")
    assert model is not None
    assert (model.max_tokens, model.price_prompt, model.price_completion) == (1024, 0.25, 1.0)
    price = ["--prompt", "1", "--completion", "1"]
    assert daemon.cli("model", "price", "nope", *price).exit_code == 4
    assert daemon.cli("model", "price", "smol", "--prompt", "-1", *price[2:]).exit_code == 2


def test_usage_by_key_model_and_day(daemon: Daemon) -> None:  # noqa: F811
    secret = daemon.cli("key", "create", "alice").stdout.strip()
    key = daemon.catalog.authenticate(secret)
    assert key is not None and daemon.usage is not None
    daemon.usage.add(("2025-03-01", key.id, "smol"), 100, 50, 1_500_000_000_000)
    daemon.usage.add(("2025-03-02", key.id, "big"), 10, 5, 0)
    since = ["--since", "2025-03-01"]
    assert rows(daemon.cli("usage", *since).stdout) == [
        ["KEY", "NAME", "REQUESTS", "PROMPT", "COMPLETION", "TOTAL", "SPEND"],
        [key.id, "alice", "2", "110", "55", "165", "1.5"],
        ["total", "2", "110", "55", "165", "1.5"],
    ]
    by_model = rows(daemon.cli("usage", "--by", "model", *since).stdout)
    assert [r[0] for r in by_model] == ["MODEL", "big", "smol", "total"]
    by_day = json.loads(
        daemon.cli("usage", "--by", "day", "--since", "2025-03-02", "--json").stdout
    )
    assert [(r["day"], r["total_tokens"]) for r in by_day["rows"]] == [("2025-03-02", 15)]
    assert "No usage since 2025-04-01." in daemon.cli("usage", "--since", "2025-04-01").stdout
    r = daemon.cli("usage", "--since", "yesterday")
    assert r.exit_code == 1 and "YYYY-MM-DD" in r.stderr


def test_usage_by_organization_names_keys_of_none_with_a_dash(daemon: Daemon) -> None:  # noqa: F811
    secret = daemon.cli("key", "create", "bare").stdout.strip()
    key = daemon.catalog.authenticate(secret)
    assert key is not None and daemon.usage is not None
    daemon.usage.add(("2025-03-01", key.id, "smol"), 100, 50, 0)
    for by in ("org", "team", "project", "user"):
        table = rows(daemon.cli("usage", "--by", by, "--since", "2025-03-01").stdout)
        assert table[0][0] == by.upper() and table[1][:2] == ["-", "1"], by


def test_usage_of_one_organization(daemon: Daemon) -> None:  # noqa: F811
    assert daemon.cli("org", "create", "acme").exit_code == 0
    secret = daemon.cli("key", "create", "bare").stdout.strip()  # of no organization
    key = daemon.catalog.authenticate(secret)
    assert key is not None and daemon.usage is not None
    daemon.usage.add(("2025-03-01", key.id, "smol"), 100, 50, 0)
    out = daemon.cli("usage", "--org", "acme", "--since", "2025-03-01").stdout
    assert "No usage since 2025-03-01." in out
    assert daemon.cli("usage", "--org", "nope").exit_code != 0
