"""Three control planes on etcd, grown from one on SQLite (`llmgw plane migrate --to etcd`,
then `llmgw plane token` and `llmgw plane join` twice): `llmgw planes` lists them with
one leader, /v1 answers through each, and the migration lost nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.cp_cluster import CPS, CpCluster, cp_cluster, planes
from integration.llmgw_node import llama_server

pytestmark = pytest.mark.skipif(
    not Path("/usr/bin/etcd").exists(), reason="etcd is not installed (/usr/bin/etcd)"
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[CpCluster]:
    with cp_cluster("srv", llama_server()) as c:
        print("\ntimings:", {k: round(v, 1) for k, v in c.timings.items()})
        yield c


def _strip(models: list[dict[str, object]]) -> list[dict[str, object]]:
    """A model as configured (its replicas' live state aside)."""
    live = ("replica_status", "ready", "parked")
    return [{k: v for k, v in m.items() if k not in live} for m in models]


def test_migrate_kept_models_keys_usage_and_engines(cluster: CpCluster) -> None:
    before, cp1 = cluster.before, cluster.cps["cp1"]
    assert before is not None
    print(before.migrate_out)
    assert "state.db.before-etcd" in before.migrate_out
    assert _strip(cp1.llmgw("models", "--json")) == _strip(before.models)
    assert cp1.llmgw("key", "list", "--json") == before.keys
    assert cp1.llmgw("usage", "--json") == before.usage
    assert any(before.usage), before.usage  # the requests made on SQLite were counted
    assert cluster.engine_pids() == before.engine_pids  # the engines were not restarted
    assert cp1.ps.run(["test", "-f", "/var/lib/llmgw/state.db.before-etcd"]).returncode == 0
    second = cp1.llmgw("plane", "migrate", "--to", "etcd", check=False)
    assert second.returncode == 1 and "is etcd already" in second.stderr, second.stderr


def test_planes_lists_three_one_leader_all_healthy(cluster: CpCluster) -> None:
    for name, node in cluster.cps.items():
        found = planes(node)
        print(name, [(s["name"], s["health"], s["role"], s["learner"]) for s in found])
        assert sorted(s["name"] for s in found) == sorted(CPS.values())
        assert [s["role"] for s in found].count("leader") == 1
        assert {s["role"] for s in found} == {"leader", "standby"}
        assert all(s["health"] == "healthy" and not s["learner"] for s in found), found
        assert [s["name"] for s in found if s["self"]] == [CPS[name]]


def test_joined_hosts_hold_the_keys_for_llmgw_only(cluster: CpCluster) -> None:
    for name in ("cp2", "cp3"):
        said = cluster.join_out[name]
        print(said)
        assert "promoted" in said and "joined cluster" in said
        node = cluster.cps[name]
        files = ["/var/lib/llmgw/pki/ca.key", "/var/lib/llmgw/secret", "/var/lib/llmgw/pki"]
        modes = node.ps.run(["stat", "-c", "%a %U", *files]).stdout.split("\n")
        assert modes[:3] == ["600 llmgw", "600 llmgw", "700 llmgw"], modes
        assert "backend: etcd" in node.ps.read_file("/etc/llmgw/server.yaml")
        for unit in ("llmgw-etcd.service", "llmgwd.service"):
            enabled = node.ps.systemctl("is-enabled", unit, check=False).stdout.strip()
            assert enabled == "enabled", (unit, enabled)
    token = cluster.cps["cp1"].llmgw("plane", "token", "--json")["token"]
    again = cluster.cps["cp2"].llmgw(
        "plane", "join", f"https://{CPS['cp1']}:7710", "--token", token, check=False
    )
    assert again.returncode == 1 and "exists" in again.stderr, again.stderr
    assert token.split(".")[1] not in again.stderr + again.stdout


def test_v1_answered_through_each_control_plane(cluster: CpCluster) -> None:
    answers = cluster.chat_each()
    print(answers)
    assert sorted(answers) == sorted(cluster.client_urls())
    assert all(a["ok"] for a in answers.values()), answers
