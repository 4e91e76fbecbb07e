"""The replicas the leader publishes in the store (/live/replicas/NODE/REPLICA), and the pool
every control plane's router reads: the leader's own agents' reports where it has them, the
published replicas elsewhere (on a standby: all of them).

The published keys carry no lease: a standby keeps the last replicas it knew while no leader
exists (a dead leader's lease would have taken them with it), and only a leader deletes them:
a replica gone from its agent's report, or a node not heard from in its term once the grace
period from the term's start has passed. No engine key is published: each control plane
derives it from the cluster secret (catalog.engine_key).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection

import msgspec

from llmgwd.catalog import engine_key
from llmgwd.nodes.pool import Endpoint
from llmgwd.nodes.state import ClusterState
from llmgwd.store import Delete, Put, Store, prefix_end

log = logging.getLogger(__name__)

LIVE = "/live/replicas/"
PERIOD_S = 1.0  # the publisher's pass at the latest; a change pokes it at once
MAX_OPS = 100  # writes per transaction (etcd refuses more than 128 by default)
_KEYS_KEPT = 4096  # engine keys remembered (HMACs), all forgotten at once past this


class LiveReplica(msgspec.Struct, frozen=True):
    """One replica the leader placed, as a standby's router needs it."""

    id: str
    model: str
    node: str
    ready: bool = False
    url: str = ""  # http://ADDRESS:PORT of the engine while ready
    priority: int = 0
    slots: int = 0
    context: int = 0


_dec = msgspec.json.Decoder(LiveReplica)
_enc = msgspec.json.Encoder()


def key_of(r: LiveReplica) -> str:
    """The replica's key under LIVE."""
    return f"{LIVE}{r.node}/{r.id}"


def snapshot(cluster: ClusterState) -> dict[str, LiveReplica]:
    """Every replica placed on a node the leader has heard from this term, by key."""
    out: dict[str, LiveReplica] = {}
    for info in cluster.nodes():
        if info.desired is None:
            continue  # nothing decided for it yet this term: its published keys stay
        models = {s.model for s in info.desired}
        ready = {ep.replica_id: ep for m in models for ep in cluster.ready(m)}
        for spec in info.desired:
            ep = ready.get(spec.id)
            r = LiveReplica(spec.id, spec.model, info.name, ep is not None, priority=spec.priority)
            if ep is not None:
                r = msgspec.structs.replace(r, url=ep.url, slots=ep.slots, context=ep.context)
            out[key_of(r)] = r
    return out


class Publisher:
    """The leader's side: writes the snapshot's changes (through the fenced store)."""

    def __init__(
        self,
        store: Store,
        cluster: ClusterState,
        *,
        grace_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._cluster = cluster
        self._grace_s = grace_s
        self._clock = clock
        self._published: dict[str, bytes] = {}
        self._started = clock()
        self._wake = asyncio.Event()

    def poke(self) -> None:
        """The cluster changed: publish soon."""
        self._wake.set()

    async def run(self) -> None:
        """Publish on every poke and every PERIOD_S, until cancelled."""
        await self.load()
        while True:
            self._wake.clear()
            await self.publish()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), PERIOD_S)

    async def load(self) -> None:
        """Read what is published (by an earlier term too): the grace period starts now."""
        kvs, _ = await self._store.range(LIVE, prefix_end(LIVE))
        self._published = {kv.key: kv.value for kv in kvs}
        self._started = self._clock()

    async def publish(self) -> None:
        """Write what changed since the last pass."""
        want = {k: _enc.encode(r) for k, r in snapshot(self._cluster).items()}
        known = set(self._cluster.decided())
        late = self._clock() - self._started > self._grace_s
        ops: list[Put | Delete] = [
            Put(k, v) for k, v in want.items() if self._published.get(k) != v
        ]
        for k in self._published.keys() - want.keys():
            if late or k[len(LIVE) :].split("/", 1)[0] in known:
                ops.append(Delete(k))
        for i in range(0, len(ops), MAX_OPS):
            batch = ops[i : i + MAX_OPS]
            await self._store.txn([], list(batch))
            for op in batch:
                if isinstance(op, Put):
                    self._published[op.key] = op.value
                else:
                    self._published.pop(op.key, None)


class Published:
    """Every control plane's side: the published replicas, followed by a watch."""

    def __init__(self, store: Store, secret: bytes) -> None:
        self._store = store
        self._secret = secret
        self._by_key: dict[str, LiveReplica] = {}
        self._keys: dict[str, str] = {}  # replica id -> its engine key
        self._ready: dict[str, list[tuple[str, LiveReplica]]] = {}  # model -> (node, replica)
        self.loaded = asyncio.Event()  # set once the first load is in

    async def follow(self) -> None:
        """Load, then follow the prefix for ever (reloading after a compaction or a failure)."""
        while True:
            try:
                kvs, revision = await self._store.range(LIVE, prefix_end(LIVE))
                self._by_key = {kv.key: _dec.decode(kv.value) for kv in kvs}
                self._ready.clear()
                self.loaded.set()
                async for ev in self._store.watch(
                    LIVE, prefix_end(LIVE), start_revision=revision + 1
                ):
                    self._ready.clear()
                    if ev.type == "put":
                        self._by_key[ev.kv.key] = _dec.decode(ev.kv.value)
                    else:
                        self._by_key.pop(ev.kv.key, None)
                return  # the store closed
            except Exception as e:  # compacted, etcd unreachable (EtcdError), a bad value
                log.warning("following the published replicas failed (%s); again", _why(e))
                await asyncio.sleep(PERIOD_S)

    def ready(self, model: str, skip: Collection[str] = ()) -> list[Endpoint]:
        """The model's published ready replicas, those on the nodes in skip left out (read at
        every /v1 request: kept per model until the published replicas change)."""
        by_model = self._ready.get(model)
        if by_model is None:
            found = [r for r in self._by_key.values() if r.model == model and r.ready and r.url]
            by_model = self._ready[model] = [(r.node, r) for r in found]
        return [self._endpoint(r) for node, r in by_model if node not in skip]

    def _endpoint(self, r: LiveReplica) -> Endpoint:
        key = self._key(r.id)
        return Endpoint(r.id, r.model, r.node, r.url, key, r.priority, r.slots, r.context)

    def _key(self, replica_id: str) -> str:
        """The replica's engine key, an HMAC made once per replica id."""
        key = self._keys.get(replica_id)
        if key is None:
            if len(self._keys) >= _KEYS_KEPT:
                self._keys.clear()
            key = self._keys[replica_id] = engine_key(self._secret, replica_id)
        return key

    def wanted(self, model: str) -> int:
        """How many replicas of model the leader placed."""
        return sum(1 for r in self._by_key.values() if r.model == model)


class RolePool:
    """The router's pool on every control plane: a node this process's cluster state knows
    (the leader's agents) from there, every other node from the published replicas."""

    def __init__(self, cluster: ClusterState, published: Published) -> None:
        self._cluster = cluster
        self._published = published

    def ready(self, model: str) -> list[Endpoint]:
        """Ready replicas of model."""
        own = self._cluster.ready(model)
        return own + self._published.ready(model, skip=set(self._cluster.decided()))

    def wanted(self, model: str) -> int:
        """How many replicas of model are wanted."""
        return self._cluster.wanted(model) or self._published.wanted(model)


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
