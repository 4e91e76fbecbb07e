"""The pool the router reads at every /v1 request (live.RolePool): a replica of a node this
control plane knows comes from its own state and costs no engine key; a published one's
engine key is made once, not at every request."""

from __future__ import annotations

from typing import Any

import pytest

from llmgwd.catalog import engine_key
from llmgwd.nodes.pool import Endpoint
from llmgwd.planes import live
from llmgwd.planes.live import LiveReplica, Published, RolePool

SECRET = b"s" * 32


class OwnCluster:
    """The leader's cluster state as RolePool reads it: node n1 is its own."""

    def ready(self, model: str) -> list[Endpoint]:
        return [Endpoint("r1", model, "n1", "http://10.0.0.1:9000", "k1")]

    def decided(self) -> list[str]:
        return ["n1"]


def test_own_replicas_cost_no_key_and_published_keys_are_made_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[str] = []

    def counted(secret: bytes, replica_id: str) -> str:
        made.append(replica_id)
        return engine_key(secret, replica_id)

    monkeypatch.setattr(live, "engine_key", counted)
    published = Published(store=None, secret=SECRET)  # type: ignore[arg-type]
    published._by_key = {
        f"/live/replicas/{node}/{rid}": LiveReplica(rid, "m", node, True, f"http://{node}:1")
        for rid, node in (("r1", "n1"), ("r2", "n2"))
    }
    pool = RolePool(OwnCluster(), published)  # type: ignore[arg-type]
    for _ in range(5):
        ready: list[Any] = pool.ready("m")
        assert [(ep.replica_id, ep.node) for ep in ready] == [("r1", "n1"), ("r2", "n2")]
        assert ready[1].api_key == engine_key(SECRET, "r2")
    assert made == ["r2"]  # n1's replica from the own state; r2's key made once
