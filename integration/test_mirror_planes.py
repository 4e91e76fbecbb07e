"""The mirror across three control planes on etcd: a set imported into one (a standby) is
copied by the two others over their cluster ports (mutual TLS, the cluster CA), `llmgw mirror
status` says so on each, and the agent linked to the leader fetches it and serves it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.cp_cluster import CPS, CpCluster, api, cp_cluster
from integration.llmgw_node import gguf, llama_server

pytestmark = pytest.mark.skipif(
    not Path("/usr/bin/etcd").exists(), reason="etcd is not installed (/usr/bin/etcd)"
)

REPO = "acme/smol-planes"


@pytest.fixture(scope="module")
def cluster() -> Iterator[CpCluster]:
    with cp_cluster("mpl", llama_server()) as c:
        yield c


def _held(status: dict[str, Any], source: str) -> list[str]:
    return next((sorted(h["planes"]) for h in status.get("held", []) if h["source"] == source), [])


def test_a_set_added_through_one_ends_up_on_all_and_is_served(cluster: CpCluster) -> None:
    cp2 = cluster.cps["cp2"]
    cp2.ps.write_file("/srv/smol/README.txt", "imported on cp2\n")
    cp2.ps.run(["cp", str(gguf()), "/srv/smol/smol.Q4_1.gguf"])
    cp2.llmgw("mirror", "import", "/srv/smol", "--as", REPO)
    added = cp2.llmgw("model", "add", "smol-planes", "--from", f"hf:{REPO}:*.gguf",
                      "--engine", "llama.cpp", "--json")  # fmt: skip
    source = added["source"]
    want = sorted(CPS.values())
    deadline = time.monotonic() + 90
    seen: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        for name, node in cluster.cps.items():
            status, body = api(node, "GET", "/mirror")
            seen[name] = _held(body, source) if status == 200 else []
        if all(v == want for v in seen.values()):
            break
        time.sleep(1)
    assert all(v == want for v in seen.values()), seen
    for name, node in cluster.cps.items():
        out = node.llmgw("mirror", "status").stdout
        print(name, out)
        assert f"{source} on {', '.join(want)}" in out
    cp2.llmgw("model", "serve", "smol-planes", "--replicas", "1")
    cp1 = cluster.cps["cp1"]
    cp1.wait(lambda: cp1.llmgw("models", "--json") and _ready(cp1), "smol-planes ready", 180)


def _ready(node: Any) -> bool:
    models = node.llmgw("models", "--json")
    return any(m["name"] == "smol-planes" and m["ready"] >= 1 for m in models)
