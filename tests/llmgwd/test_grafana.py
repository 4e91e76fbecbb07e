"""The Grafana dashboard the packages install (packaging/grafana/llmgw.json): every metric
it queries is one llmgwd's /metrics serves, and every query is PromQL that promtool accepts."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from llmgw.wire import ReplicaStatus
from llmgwd.metrics.cluster import ClusterCollector
from llmgwd.metrics.gpus import GpuCollector
from llmgwd.metrics.scrape import Scraper
from llmgwd.router.metrics import RouterMetrics
from tests.llmgw_agentd.nvml_inventory import hopper_mig, load, recorded
from tests.llmgwd.test_metrics import Pool, node

DASHBOARD = Path(__file__).resolve().parents[2] / "packaging/grafana/llmgw.json"
NAME = re.compile(r"\bllmgw_[a-z0-9_]+")
# Grafana's variables, as a query would read once Grafana filled them in.
VARIABLES = {"$__rate_interval": "1m", "$model": ".*"}


def queries(dashboard: dict[str, Any]) -> Iterator[str]:
    """Every PromQL query of the dashboard: its panels' and its variables'."""
    for panel in dashboard["panels"]:
        yield from (target["expr"] for target in panel["targets"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["definition"]


async def served_names() -> set[str]:
    """The sample names of llmgwd's /metrics with one model's traffic, a MIG node and a
    Hopper MIG node (whose instances have GPM's counters)."""
    registry = CollectorRegistry()
    router = RouterMetrics(registry, lambda name: name == "m")
    router.requests.labels("m", "/v1/chat/completions", "2xx").inc()
    router.first_token.labels("m").observe(0.1)
    router.settled("m", 3, 2, 0)
    router.refusals.labels("m", "budget").inc()
    replicas = (ReplicaStatus("r1", "m", "ready"),)
    nodes = [node("dgx", recorded(load("dgx-h100-8x80gb")), replicas=replicas),
             node("a100", recorded(load("a100-80gb-mig"))),
             node("hopper", recorded(hopper_mig()))]  # fmt: skip
    cluster = ClusterCollector(lambda: ["m"], Pool(), lambda: nodes, lambda m: 0, 60.0)
    text = await Scraper(registry, [cluster, GpuCollector(lambda: nodes)]).render()
    return {s.name for f in text_string_to_metric_families(text.decode()) for s in f.samples}


async def test_every_metric_the_dashboard_queries_is_served() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    wanted = {name for query in queries(dashboard) for name in NAME.findall(query)}
    assert {"llmgw_requests_total", "llmgw_first_token_seconds_bucket", "llmgw_tokens_total",
            "llmgw_gpu_memory_used_bytes", "llmgw_gpu_busy_ratio", "llmgw_replicas_wanted",
            "llmgw_replicas_ready", "llmgw_gpu_sm_active_ratio", "llmgw_mig_sm_active_ratio",
            "llmgw_gpu_tensor_active_ratio", "llmgw_mig_tensor_active_ratio"} <= wanted  # fmt: skip
    assert wanted - await served_names() == set()


def test_each_panel_queries_the_dashboards_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "llmgw"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_every_query_is_promql(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    rules = []
    for i, query in enumerate(queries(dashboard)):
        if query.startswith("label_values("):
            continue  # Grafana's own function, not PromQL
        for variable, filled in VARIABLES.items():
            query = query.replace(variable, filled)
        rules.append({"record": f"dashboard:query_{i}", "expr": query})
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                       text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
