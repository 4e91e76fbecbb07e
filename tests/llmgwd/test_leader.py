"""Leadership over one store, as three control planes in one process would have it: the
election, failover when the leader's lease ends, stepping down on its own clock, and the
fence that refuses a stale leader's writes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from llmgw.wire import ReplicaSpec
from llmgwd.catalog import Catalog
from llmgwd.placement.reconciler import NODE_FLAGS, NodeFlags, NodeView, Reconciler
from llmgwd.planes.fence import Fenced, FencedStore
from llmgwd.planes.leader import LEADER, Election, LeaderRecord
from llmgwd.planes.session import Session
from llmgwd.store import Compare, Put, Store
from llmgwd.store.sqlite import SqliteStore

TTL_S = 1.0


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(":memory:")
    yield s
    await s.close()


async def eventually(check: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Wait until check() is true (a generous bound: the test never fails on a time)."""
    async with asyncio.timeout(timeout_s):
        while not check():  # noqa: ASYNC110 (several tasks, no one event)
            await asyncio.sleep(0.02)


@dataclass
class Plane:
    """One control plane's leadership: its session, election, and the terms it led."""

    name: str
    session: Session
    election: Election
    terms: list[int] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    on_end: Callable[[int], object] | None = None

    async def lead(self, term: int) -> None:
        self.terms.append(term)
        try:
            await asyncio.Event().wait()
        finally:
            if self.on_end is not None:
                await self.on_end(term)  # type: ignore[misc]
            self.ended.append(term)

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self.session.run()),
            asyncio.create_task(self.election.run(self.lead)),
        ]

    async def kill(self) -> None:
        """kill -9: its tasks stop, nothing is released; the store forgets it at the TTL."""
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def plane(store: Store, name: str, ttl_s: float = TTL_S) -> Plane:
    session = Session(store, ttl_s)
    election = Election(store, session, LeaderRecord(name, f"https://{name}:7710"))
    return Plane(name, session, election)


@pytest.fixture
async def planes(store: SqliteStore) -> AsyncIterator[list[Plane]]:
    made = [plane(store, n) for n in ("cp1", "cp2", "cp3")]
    for p in made:
        p.start()
    yield made
    for p in made:
        await p.kill()


def leaders(planes: list[Plane]) -> list[Plane]:
    return [p for p in planes if p.election.leading]


async def test_one_leader_and_every_standby_knows_it(
    planes: list[Plane], store: SqliteStore
) -> None:
    await eventually(lambda: len(leaders(planes)) == 1)
    (leader,) = leaders(planes)
    kv = await store.get(LEADER)
    assert kv is not None and leader.election.term == kv.create_revision
    await eventually(lambda: all(p.election.leader == leader.election.me for p in planes))


async def test_a_killed_leader_is_replaced_with_a_new_term(planes: list[Plane]) -> None:
    await eventually(lambda: len(leaders(planes)) == 1)
    (old,) = leaders(planes)
    term = old.election.term
    started = asyncio.get_running_loop().time()

    await old.kill()  # its lease runs out in the store, its key with it

    rest = [p for p in planes if p is not old]
    await eventually(lambda: len(leaders(rest)) == 1)
    taken = asyncio.get_running_loop().time() - started
    (new,) = leaders(rest)
    assert new.election.term > term
    logging.getLogger(__name__).info("new leader after %.2f s (TTL %g s)", taken, TTL_S)


async def test_a_stopped_leader_hands_over_at_once(planes: list[Plane], store: Store) -> None:
    await eventually(lambda: len(leaders(planes)) == 1)
    (old,) = leaders(planes)
    for t in old.tasks[1:]:
        t.cancel()  # llmgwd stopping: its term ends and the key is deleted
    await asyncio.gather(*old.tasks[1:], return_exceptions=True)
    assert old.ended == old.terms
    await eventually(lambda: len(leaders([p for p in planes if p is not old])) == 1, 0.5 * TTL_S)


class StalledKeepalive:
    """A store whose lease renewals hang (a leader cut off from it)."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self.stalled = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def lease_keepalive(self, lease: int) -> float:
        if self.stalled:
            await asyncio.Event().wait()
        return await self._store.lease_keepalive(lease)


async def test_a_leader_that_cannot_renew_steps_down_before_its_lease_runs_out(
    store: SqliteStore,
) -> None:
    cut = StalledKeepalive(store)
    p = plane(cut, "cp1", ttl_s=3.0)  # type: ignore[arg-type]
    key_at_end: list[bool] = []

    async def check_key(_term: int) -> None:
        key_at_end.append(await store.get(LEADER) is not None)

    p.on_end = check_key
    p.start()
    try:
        await eventually(lambda: p.election.leading)
        cut.stalled = True
        await eventually(lambda: p.ended)
        # The reconciler stopped while the store still held the term's key: never two leaders.
        assert key_at_end == [True]
    finally:
        await p.kill()


async def test_a_restarted_control_plane_ends_its_own_old_term(store: SqliteStore) -> None:
    first = plane(store, "cp1", ttl_s=60.0)
    first.start()
    await eventually(lambda: first.election.leading)
    await first.kill()  # its lease would hold the key for a minute

    again = plane(store, "cp1", ttl_s=60.0)
    again.start()
    try:
        await eventually(lambda: again.election.leading, 5.0)
        assert again.election.term > first.terms[0]
    finally:
        await again.kill()


# The fence


async def test_a_stale_leaders_writes_are_refused_and_the_store_is_unchanged(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    lease = await store.lease_grant(60)
    won = await store.txn([Compare(LEADER, "version", "=", 0)], [Put(LEADER, b"a", lease)])
    assert won.succeeded
    old = (await store.get(LEADER)).create_revision  # type: ignore[union-attr]
    await store.put("/placements/r1", b"kept")
    await store.lease_revoke(lease)  # the old leader paused past its TTL...
    await store.put(LEADER, b"b")  # ...and another leads
    before = await store.revision()
    refusals: list[str] = []
    fenced = FencedStore(store, old, refusals.append)

    with pytest.raises(Fenced):
        await fenced.put("/placements/r2", b"x")
    with pytest.raises(Fenced):
        await fenced.delete("/placements/r1")

    assert await store.revision() == before
    assert (await store.get("/placements/r1")).value == b"kept"  # type: ignore[union-attr]
    assert await store.get("/placements/r2") is None
    assert len(refusals) == 1  # the election is told once, and it is logged once
    assert sum("was refused" in r.message for r in caplog.records) == 1


async def test_the_current_leaders_writes_pass_the_fence(store: SqliteStore) -> None:
    await store.put(LEADER, b"me")
    term = (await store.get(LEADER)).create_revision  # type: ignore[union-attr]
    fenced = FencedStore(store, term, lambda _why: None)
    await fenced.put("/x", b"1")
    assert await fenced.delete("/x") == (1, await store.revision())
    res = await fenced.txn([Compare("/y", "version", "=", 1)], [Put("/y", b"2")])
    assert not res.succeeded and res.responses == []  # the caller's compare failed, not the fence
    assert not fenced.refused


async def test_a_reconciler_of_a_stale_term_changes_nothing(store: SqliteStore) -> None:
    await store.put(LEADER, b"old")
    old = (await store.get(LEADER)).create_revision  # type: ignore[union-attr]
    await store.delete(LEADER)
    await store.put(LEADER, b"new")
    steps: list[str] = []
    rec = Reconciler(FencedStore(store, old, steps.append), Catalog(store), _NoNodes(), b"s")

    with pytest.raises(Fenced):
        await rec.set_flags("n1", NodeFlags(cordoned=True))

    assert await store.get(NODE_FLAGS + "n1") is None
    assert len(steps) == 1


class _NoNodes:
    def nodes(self) -> list[NodeView]:
        return []

    def set_desired(self, node: str, specs: list[ReplicaSpec]) -> None:
        pass

    def removed(self, node: str) -> bool:
        return False


class Down:
    """A store whose lease calls fail, as a member cut off from its cluster's quorum."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.down = False

    async def lease_grant(self, ttl_s: float) -> int:
        if self.down:
            raise OSError("unreachable")
        return await self.store.lease_grant(ttl_s)

    async def lease_keepalive(self, lease: int) -> float:
        if self.down:
            raise OSError("unreachable")
        return await self.store.lease_keepalive(lease)


async def test_a_session_cut_from_the_store_is_stale_after_its_grace(store: SqliteStore) -> None:
    now = [0.0]
    down = Down(store)
    session = Session(down, 4.0, clock=lambda: now[0])  # type: ignore[arg-type]
    await session._grant()
    assert session.trusted() and session.stale_s(10) == 0.0
    down.down = True
    now[0] = 2.0  # trusted until 0.6 of the TTL after the grant was sent: 2.4
    with pytest.raises(OSError):
        await session._renew()
    now[0] = 10.0  # untrusted for 7.6 s: within a grace of 10
    assert not session.trusted() and session.stale_s(10) == 0.0
    now[0] = 14.0
    assert session.stale_s(10) == pytest.approx(11.6)
    assert session.stale_s(0) == 0.0  # no grace: never refuses
    down.down = False
    await session._grant()
    assert session.stale_s(10) == 0.0
