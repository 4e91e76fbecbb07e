"""The leader's reconciler: wanted replica counts into placements, and each node's Desired set."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import Counter
from typing import Protocol

import msgspec

from llmgw.wire import ReplicaSpec
from llmgwd.catalog import Catalog, Model, engine_key
from llmgwd.store import Store, prefix_end

log = logging.getLogger(__name__)

PLACEMENTS = "/placements/"


class Placement(msgspec.Struct, frozen=True):
    """Where one replica runs. Kept in the store so that a restarted llmgwd finds the same
    replica ids on the same nodes, and the agents keep their engines instead of restarting."""

    id: str
    model: str
    node: str


_dec = msgspec.json.Decoder(Placement)
_enc = msgspec.json.Encoder()


class Nodes(Protocol):
    """What the reconciler needs of the cluster state."""

    def connected(self) -> list[str]:
        """Names of the nodes whose agent is connected now."""
        ...

    def known(self) -> list[str]:
        """Names of every node seen since start (connected or not)."""
        ...

    def set_desired(self, node: str, specs: list[ReplicaSpec]) -> None:
        """Tell a node the full set of replicas it should run."""
        ...


def replica_id(model: str) -> str:
    """A new replica's id: the model's name and a short random part (unit names stay readable)."""
    return f"{model}-{secrets.token_hex(3)}"


def plan(
    models: list[Model], placements: list[Placement], nodes: list[str]
) -> tuple[list[Placement], list[Placement]]:
    """The placements to add and to remove so every model has its wanted count.

    New replicas go to the connected node with the fewest replicas (of that model, then in
    all), so replicas of one model spread across nodes.
    """
    by_model: dict[str, list[Placement]] = {}
    for p in placements:
        by_model.setdefault(p.model, []).append(p)
    wanted = {m.name: m.replicas for m in models}
    load = Counter(p.node for p in placements)
    add: list[Placement] = []
    remove = [p for p in placements if p.model not in wanted]
    for m in models:
        have = by_model.get(m.name, [])
        if len(have) > m.replicas:
            remove.extend(sorted(have, key=lambda p: p.id)[m.replicas :])
            continue
        mine = Counter(p.node for p in have)
        for _ in range(m.replicas - len(have)):
            if not nodes:
                break
            node = min(nodes, key=lambda n: (mine[n], load[n], n))
            add.append(Placement(id=replica_id(m.name), model=m.name, node=node))
            mine[node] += 1
            load[node] += 1
    return add, remove


class Reconciler:
    """Runs plan() whenever the catalog or the cluster changes, and pushes Desired sets."""

    def __init__(self, store: Store, catalog: Catalog, nodes: Nodes, secret: bytes) -> None:
        self._store = store
        self._catalog = catalog
        self._nodes = nodes
        self._secret = secret
        self._wake = asyncio.Event()
        self._placements: dict[str, Placement] = {}

    def poke(self) -> None:
        """Something changed: reconcile soon (many pokes make one pass)."""
        self._wake.set()

    async def run(self, period_s: float = 5.0) -> None:
        """Reconcile on every poke and every period, for ever."""
        await self._load()
        while True:
            self._wake.clear()
            try:
                await self.reconcile()
            except Exception:
                log.exception("reconcile pass failed; trying again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), period_s)

    async def _load(self) -> None:
        kvs, _ = await self._store.range(PLACEMENTS, prefix_end(PLACEMENTS))
        self._placements = {p.id: p for p in (_dec.decode(kv.value) for kv in kvs)}

    async def reconcile(self) -> None:
        """One pass: store the placement changes, then send every node its set."""
        models = self._catalog.all()
        add, remove = plan(models, list(self._placements.values()), self._nodes.connected())
        for p in add:
            await self._store.put(PLACEMENTS + p.id, _enc.encode(p))
            self._placements[p.id] = p
            log.info(
                "replica %s of %s placed on %s",
                p.id,
                p.model,
                p.node,
                extra={"model": p.model, "replica": p.id, "node": p.node},
            )
        for p in remove:
            await self._store.delete(PLACEMENTS + p.id)
            self._placements.pop(p.id, None)
            log.info(
                "replica %s of %s removed from %s",
                p.id,
                p.model,
                p.node,
                extra={"model": p.model, "replica": p.id, "node": p.node},
            )
        self.push(models)

    def push(self, models: list[Model]) -> None:
        """Send each known node the specs of the replicas placed on it."""
        by_name = {m.name: m for m in models}
        per_node: dict[str, list[ReplicaSpec]] = {n: [] for n in self._nodes.known()}
        for p in sorted(self._placements.values(), key=lambda p: p.id):
            m = by_name.get(p.model)
            if m is not None:
                per_node.setdefault(p.node, []).append(self.spec(p, m))
        for node, specs in per_node.items():
            self._nodes.set_desired(node, specs)

    def spec(self, p: Placement, m: Model) -> ReplicaSpec:
        """What the node needs to run replica p of model m."""
        return ReplicaSpec(
            id=p.id,
            model=m.name,
            engine=m.engine,
            source=m.source,
            args=list(m.args),
            context=m.context,
            api_key=engine_key(self._secret, p.id),
        )

    def placements(self) -> list[Placement]:
        """Where every replica is, now."""
        return list(self._placements.values())
