"""The Prometheus files the packages install (packaging/prometheus/): promtool accepts the
rules and the scrape config, the rules' unit tests pass, and every series the rules read is
one llmgwd's /metrics serves, with label values llmgwd gives it."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from llmgw import pki
from llmgwd.accounting.levels import Levels
from llmgwd.metrics import budgets
from llmgwd.metrics.certificates import Certificates
from llmgwd.metrics.cluster import NODE_STATES, REPLICA_STATES
from llmgwd.metrics.scrape import Scraper, Snapshotting
from llmgwd.metrics.store_health import StoreHealth
from llmgwd.router import metrics as router_metrics
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.test_grafana import served_names

HERE = Path(__file__).resolve().parents[1] / "packaging/prometheus"
RULES, TESTS, SCRAPE = HERE / "llmgw.rules.yml", HERE / "tests.yml", HERE / "prometheus.yml"
# What Prometheus makes of each scrape itself, not llmgwd.
PROMETHEUS_OWN = {"up"}
# The label values the rules match, as llmgwd gives them.
LABEL_VALUES = {
    ("llmgw_nodes", "state"): set(NODE_STATES),
    ("llmgw_replicas", "state"): set(REPLICA_STATES),
    ("llmgw_refusals_total", "reason"): set(router_metrics._REFUSALS.values()),
}
_STRING = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'""")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:]|\s*\()")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
_MATCHER = re.compile(r'(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"')


def expressions() -> Iterator[str]:
    """Every rule's PromQL expression."""
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        yield from (rule["expr"] for rule in group["rules"])


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects (not its functions, labels, keywords)."""
    bare = _STRING.sub('""', expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    bare = _GROUPING.sub(" ", bare)
    return {n for n in _NAME.findall(bare) if n.lower() not in _KEYWORDS}


async def health_names(tmp_path: Path) -> set[str]:
    """The sample names of the budgets', the store's and the certificates' series, with a
    budget and a certificate to show."""
    cert = tmp_path / "ca.pem"
    cert.write_bytes(pki.make_ca().cert_pem)
    store = await SqliteStore.open(":memory:")
    series = budgets.BudgetSeries(list, list, Levels(), store)
    series.budgets = (
        budgets.Budget("key", "k1", "tokens", "day", 1000.0, 10.0),
        budgets.Budget("org", "acme", "spend", "month", 20.0, 4.5),
    )
    collectors: list[Snapshotting] = [series, StoreHealth(None), Certificates({"ca": cert})]
    text = await Scraper(CollectorRegistry(), collectors).render()
    await store.close()
    return {s.name for f in text_string_to_metric_families(text.decode()) for s in f.samples}


def _promtool(*args: str) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    r = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120,
                       check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr


def test_metric_names_reads_selectors_not_functions_or_labels() -> None:
    expr = ('max by (job, model) (rate(a_total{reason="b_c"}[5m]) - a_total offset 15m) > 0 '
            'and on() count(up{job="x"}) > 1e3 or vector(1)')  # fmt: skip
    assert metric_names(expr) == {"a_total", "up"}


async def test_every_series_the_rules_read_is_one_llmgwd_serves(tmp_path: Path) -> None:
    wanted = {name for expr in expressions() for name in metric_names(expr)}
    # The alerts the packages promise, each on its series.
    assert {"up", "llmgw_nodes", "llmgw_replicas", "llmgw_engine_restarts_total",
            "llmgw_replicas_wanted", "llmgw_replicas_ready",
            "llmgw_refusals_total"} <= wanted  # fmt: skip
    assert {"llmgw_budget_tokens_used", "llmgw_budget_tokens_limit",
            "llmgw_budget_spend_currency_units_used", "llmgw_budget_spend_currency_units_limit",
            "llmgw_store_quorum",
            "llmgw_store_voters", "llmgw_store_voters_healthy",
            "llmgw_certificate_expiry_timestamp_seconds"} <= wanted  # fmt: skip
    served = await served_names() | await health_names(tmp_path)
    assert wanted - PROMETHEUS_OWN - served == set()


def test_every_label_value_the_rules_match_is_one_llmgwd_gives() -> None:
    matched = 0
    for expr in expressions():
        for name, matchers in _SELECTOR.findall(expr):
            for label, op, value in _MATCHER.findall(matchers):
                if name in PROMETHEUS_OWN:
                    continue
                assert op == "=", f"{name}{{{label}{op}...}}: match exact values"
                assert value in LABEL_VALUES[(name, label)], f'{name}{{{label}="{value}"}}'
                matched += 1
    assert matched >= 4


def test_promtool_checks_the_rules() -> None:
    _promtool("check", "rules", str(RULES))


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    """Each alert over recorded series: fires when it should, not when it should not."""
    _promtool("test", "rules", str(TESTS))


def test_promtool_checks_the_scrape_config(tmp_path: Path) -> None:
    """The example as shipped, its token file and the installed rules' path made here."""
    text = SCRAPE.read_text()
    assert text.count("credentials_file: /etc/prometheus/llmgw.token") == 2
    assert "metrics_path: /metrics/engines" in text
    token = tmp_path / "llmgw.token"
    token.write_text("metrics-llmgw-x\n")
    text = text.replace("/etc/prometheus/llmgw.token", str(token))
    text = text.replace("/usr/share/llmgw/prometheus/llmgw.rules.yml", str(RULES))
    config = tmp_path / "prometheus.yml"
    config.write_text(text)
    _promtool("check", "config", str(config))
