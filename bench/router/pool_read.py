"""bench/router/pool_read.py: the cost of one read of the router's pool (live.RolePool.ready,
read at every /v1 request) on a leader whose nodes each run replicas of the model asked
for, all of them also published (as a leader publishes them), for 1x1, 1x4 and 20x4.

    PYTHONPATH=TREE/llmgwd/src:TREE/src .venv/bin/python bench/router/pool_read.py

prints microseconds a read (the best of 5 repeats): run it on two trees to compare."""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable

from llmgw import wire
from llmgwd.nodes.state import ClusterState, _Node
from llmgwd.planes.live import LiveReplica, Published, RolePool

INVENTORY = wire.Inventory(cores=2, memory_bytes=8 << 30, memory_free_bytes=4 << 30)


def pool(nodes: int, replicas: int) -> RolePool:
    """A leader's pool: nodes connected, each with replicas ready, all published too."""
    state = ClusterState(grace_s=30)
    published = Published(store=None, secret=b"s" * 32)  # type: ignore[arg-type]
    live: dict[str, LiveReplica] = {}
    for n in range(nodes):
        name = f"n{n}"
        specs = [
            wire.ReplicaSpec(id=f"{name}-{r}", model="m", engine="llama.cpp", source="file:/m",
                             api_key="k")
            for r in range(replicas)
        ]  # fmt: skip
        status = tuple(
            wire.ReplicaStatus(id=s.id, model="m", state="ready", port=20000 + r)
            for r, s in enumerate(specs)
        )
        register = wire.Register(name, "10.0.0.1", "bench", INVENTORY, list(status))
        state._desired[name] = tuple(specs)
        now = time.monotonic()
        state._nodes[name] = _Node(register, status, INVENTORY, now, time.time(), conn=object())  # type: ignore[arg-type]
        for r, s in enumerate(specs):
            url = f"http://10.0.0.1:{20000 + r}"
            live[f"/live/replicas/{name}/{s.id}"] = LiveReplica(s.id, "m", name, True, url)
    published._by_key = live
    return RolePool(state, published)


def _reader(p: RolePool) -> Callable[[], object]:
    return lambda: p.ready("m")


def main() -> None:
    for nodes, replicas in ((1, 1), (1, 4), (20, 4)):
        p = pool(nodes, replicas)
        assert len(p.ready("m")) == nodes * replicas
        n = 20000 if nodes == 1 else 2000
        best = min(timeit.repeat(_reader(p), number=n, repeat=5)) / n
        print(f"{nodes} node(s) x {replicas} replica(s): {best * 1e6:.1f} us a read")


if __name__ == "__main__":
    main()
