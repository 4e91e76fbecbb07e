"""Limits and budgets held for the cluster: two and three Meters (each a control plane with its
own in-memory Usage) over one store, hammered at once, never let a key past its budget or its
requests per minute; a control plane that dies with a share costs at most that share, and
the share comes back when its lease runs out."""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from llmgwd.accounting import allotment_ledger as ledgers
from llmgwd.accounting.allotments import Allotments
from llmgwd.accounting.periods import day_id
from llmgwd.accounting.shares import Refill
from llmgwd.accounting.usage import USAGE, Counts, Usage
from llmgwd.catalog import ApiKey, KeyLimits, Model
from llmgwd.router import ApiError
from llmgwd.router.metering import Meter
from llmgwd.router.token_bounds import Estimate
from llmgwd.store import Put, prefix_end
from llmgwd.store.sqlite import SqliteStore

NOW = calendar.timegm((2025, 3, 4, 12, 0, 0))  # noon UTC: the budgets' day does not move
DAY = day_id(NOW)
MODEL = Model(name="smol", source="file:/m.gguf", price_prompt=1.0, price_completion=2.0)
ASK = Estimate(prompt=50, completion=100)  # reserves 150 tokens
ANSWER = json.dumps({"usage": {"prompt_tokens": 30, "completion_tokens": 70}}).encode()
USED = 100  # tokens each answered request uses
WORKERS = 8  # concurrent clients on each control plane


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(":memory:")
    yield s
    await s.close()


@dataclass
class Plane:
    """One control plane: its Meter over its own Usage, and its shares."""

    meter: Meter
    shares: Allotments
    answered: int = 0  # requests admitted and answered
    refused: int = 0
    codes: set[str | None] = field(default_factory=set)  # the refusals' error codes


async def plane(store: SqliteStore, **kw: Any) -> Plane:
    shares = Allotments(store, wall=lambda: NOW, tick_s=0.01, dry_s=0.05, wait_s=5.0, **kw)
    await shares.start()
    return Plane(Meter(Usage(store), shares=shares, wall=lambda: NOW), shares)


def key(**limits: Any) -> ApiKey:
    return ApiKey(id="k1", name="alice", hash="", prefix="sk-llmgw-a", limits=KeyLimits(**limits))


async def hammer(p: Plane, k: ApiKey, *, stop_at_refusal: bool = True, each: int = 0) -> None:
    """WORKERS clients sending requests back to back (each in flight across a yield) until
    one is refused (or each are sent)."""

    async def client() -> None:
        sent = 0
        while not each or sent < each:
            sent += 1
            try:
                r = await p.meter.reserve(k, MODEL, ASK)
            except ApiError as e:
                assert e.status == 429
                p.refused += 1
                p.codes.add(e.detail.code)
                if stop_at_refusal:
                    return
                continue
            await asyncio.sleep(0)  # in flight: the others run meanwhile
            r.tally.whole(200, ANSWER)
            r.settle()
            p.answered += 1

    await asyncio.gather(*(client() for _ in range(WORKERS)))


async def eventually(done: Callable[[], Awaitable[bool]]) -> None:
    """Until done() (what it waits for takes a fraction of a second; a minute is a failure)."""
    for _ in range(1200):
        if await done():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("never happened")


async def ledger(store: SqliteStore, pot: str) -> ledgers.Ledger:
    kv = await store.get(pot)
    return ledgers.decode(kv.value) if kv else ledgers.Ledger()


async def stored_tokens(store: SqliteStore) -> int:
    kvs, _ = await store.range(USAGE, prefix_end(USAGE))
    counts = [msgspec.json.decode(kv.value, type=Counts) for kv in kvs]
    return sum(c.prompt_tokens + c.completion_tokens for c in counts)


@pytest.mark.parametrize("planes", [2, 3])
async def test_a_budget_spent_through_every_control_plane_is_never_overspent(
    store: SqliteStore, planes: int
) -> None:
    budget = 30_000  # 300 requests of 100 tokens
    k = key(budget_tokens=budget)
    ps = [await plane(store) for _ in range(planes)]
    await asyncio.gather(*(hammer(p, k) for p in ps))
    spent = sum(p.answered for p in ps) * USED
    print(f"{planes} planes: spent {spent} of {budget}, answered {[p.answered for p in ps]}")
    assert spent <= budget
    assert spent >= budget - planes * 4 * 150  # at most a few requests' worth left unspent
    assert set().union(*(p.codes for p in ps)) == {"insufficient_quota"}
    for p in ps:
        await p.shares.stop()
        await p.meter.usage.stop()
    pot = await ledger(store, ledgers.budget_key(DAY, "k1", "tokens"))
    assert pot.shares == {}  # every share given back
    assert pot.spent == spent == await stored_tokens(store)  # the same spend as usage's


@pytest.mark.parametrize("planes", [2, 3])
async def test_requests_per_minute_hold_for_the_cluster(store: SqliteStore, planes: int) -> None:
    rpm = 60
    ps = [await plane(store) for _ in range(planes)]
    await asyncio.gather(*(hammer(p, key(rpm=rpm), each=20) for p in ps))
    passed = sum(p.answered for p in ps)
    print(f"{planes} planes, rpm {rpm}: {passed} passed ({[p.answered for p in ps]})")
    assert passed <= rpm
    assert passed >= rpm - planes * 4  # what shares left unused at the end
    assert set().union(*(p.codes for p in ps)) == {"rate_limit_exceeded"}
    for p in ps:
        await p.shares.stop()


async def test_per_process_counting_lets_through_n_on_each(store: SqliteStore) -> None:
    """What the shares prevent: three meters counting alone let N through each."""
    ps = [Plane(Meter(Usage(store), wall=lambda: NOW), Allotments(store)) for _ in range(3)]
    await asyncio.gather(*(hammer(p, key(rpm=60), each=20) for p in ps))
    assert sum(p.answered for p in ps) == 3 * 60


def admit_all(p: Plane, k: ApiKey) -> None:
    """Requests admitted and answered on p's share alone, until it is short (synchronous:
    nothing reaches the store, as on a plane killed before its next step)."""
    while True:
        try:
            r = p.meter.admit(k, MODEL, ASK)
        except ApiError:
            return
        r.tally.whole(200, ANSWER)
        r.settle()
        p.answered += 1


async def test_a_control_plane_killed_with_a_share_never_lets_the_budget_be_overspent(
    store: SqliteStore,
) -> None:
    budget = 3000
    k = key(budget_tokens=budget)
    pot_key = ledgers.budget_key(DAY, "k1", "tokens")
    dead = await plane(store, ttl_s=0.5)
    await hammer(dead, k, each=1)  # eight requests: a share taken
    admit_all(dead, k)  # more, on that share, never reported
    await dead.shares.stop(give_back=False)  # killed: its lease runs on, then out
    pot = await ledger(store, pot_key)
    share, reported = pot.shares[dead.shares.holder], pot.spent
    unreported = dead.answered * USED - reported
    assert 150 < unreported <= share

    alive = await plane(store)
    await hammer(alive, k)
    first = alive.answered * USED
    assert budget - reported - share - 150 < first <= budget - reported - share

    async def taken_back() -> bool:  # its lease expires, then the alive one's refill takes it
        await hammer(alive, k)
        return dead.shares.holder not in (await ledger(store, pot_key)).shares

    await eventually(taken_back)
    await hammer(alive, k)
    total = alive.answered * USED
    await alive.shares.stop()
    await alive.meter.usage.stop()
    pot = await ledger(store, pot_key)
    print(
        f"dead share {share} ({unreported} of it used, not reported): alive spent {first} "
        f"while it lasted, {total} after; the dead one {dead.answered * USED}; "
        f"ledger {pot}; stored usage {await stored_tokens(store)}"
    )
    assert total + dead.answered * USED <= budget  # never overspent
    assert total == first  # the dead share never came back: it was counted as spent
    assert pot.spent == reported + share + total and pot.shares == {}
    # Usage counts what each plane flushed: the dead one never did (its last 5 s are lost).
    assert await stored_tokens(store) == total


class Lapsing(SqliteStore):
    """A store this control plane cannot renew its lease at while cut (paused, or cut off),
    then can again."""

    renewing: asyncio.Event | None = None  # while made and not set, renewals wait

    async def lease_keepalive(self, lease: int) -> float:
        if self.renewing is not None:
            await self.renewing.wait()
        return await super().lease_keepalive(lease)


async def test_a_share_lost_with_a_lapsed_lease_is_spent_once(tmp_path: Path) -> None:
    """A control plane whose lease ran out (its share counted as spent, whole) takes a new
    one and goes on: what it used of the old share is not counted a second time."""
    store = await Lapsing.open(tmp_path / "state.db")
    assert isinstance(store, Lapsing)
    pot_key = ledgers.budget_key(DAY, "k1", "tokens")
    try:
        p = await plane(store, ttl_s=0.4)
        k = key(budget_tokens=100_000)
        for _ in range(3):  # a share taken for the first; all used on it, not reported yet
            r = await p.meter.reserve(k, MODEL, ASK)
            r.tally.whole(200, ANSWER)
            r.settle()
        before = await ledger(store, pot_key)
        old, share = p.shares.holder, before.shares[p.shares.holder]
        assert before.spent == 0
        store.renewing = asyncio.Event()
        await eventually(lambda: _gone(store, ledgers.live_key(old)))
        store.renewing.set()
        await eventually(lambda: _relet(p, old))
        await hammer(p, k, each=1)
        await p.shares.stop()
        after = await ledger(store, pot_key)
        print(f"before the lapse {before}, after {after}; {p.answered} answered")
        assert after.shares == {}
        assert after.spent == before.spent + share + WORKERS * USED
    finally:
        await store.close()


async def _gone(store: SqliteStore, key: str) -> bool:
    return await store.get(key) is None


async def _relet(p: Plane, old: str) -> bool:
    return p.shares.holder != old


async def test_a_new_pot_starts_from_the_stored_usage_and_idle_shares_come_back(
    store: SqliteStore,
) -> None:
    before = Counts(requests=10, prompt_tokens=400, completion_tokens=600)
    await store.txn([], [Put(f"{USAGE}{DAY}/k1/smol", msgspec.json.encode(before))])
    p = await plane(store, idle_s=0.05)
    await hammer(p, key(budget_tokens=1500))  # 1000 used before the budget was set
    assert p.answered * USED <= 500
    pot = ledgers.budget_key(DAY, "k1", "tokens")

    async def given_back() -> bool:  # idle: given back
        return not (await ledger(store, pot)).shares

    await eventually(given_back)
    assert (await ledger(store, pot)).spent == 1000 + p.answered * USED
    await p.shares.stop()


async def test_no_store_write_on_the_request_path(store: SqliteStore) -> None:
    """Once a share is held, requests that fit it leave the store as it was."""
    p = await plane(store)
    k = key(budget_tokens=10**9, rpm=10**6)
    await hammer(p, k, each=1)  # the first requests take the shares
    steps, revision = p.shares.steps, await store.revision()
    for _ in range(50):
        r = p.meter.admit(k, MODEL, ASK)  # synchronous: no await, so no store access
        r.tally.whole(200, ANSWER)
        r.settle()
    assert await store.revision() == revision + (p.shares.steps - steps)
    await p.shares.stop()


class Slow(SqliteStore):
    """A store whose transactions take a while (a far or busy etcd)."""

    delay_s = 0.3

    async def txn(self, *args: Any, **kw: Any) -> Any:
        await asyncio.sleep(self.delay_s)
        return await super().txn(*args, **kw)


async def test_a_request_waits_for_a_refill_under_way_at_most_wait_s(tmp_path: Path) -> None:
    slow = await Slow.open(tmp_path / "state.db")
    try:
        k = key(budget_tokens=10_000)
        patient = await plane(slow)  # waits up to 5 s
        await hammer(patient, k, each=1)
        assert (patient.answered, patient.refused) == (WORKERS, 0)  # all waited, none refused
        await patient.shares.stop()

        hasty = await plane(slow)
        hasty.shares.wait_s = 0.01
        await hammer(hasty, key(budget_tokens=10_000, rpm=1000), each=1)
        assert hasty.answered == 0 and hasty.codes == {"insufficient_quota"}  # no share yet

        async def refilled() -> bool:
            return not hasty.shares.check("k1", key(budget_tokens=10_000).limits, 150, 0, 1, DAY)

        await eventually(refilled)  # the refill the refused requests started
        r = await hasty.meter.reserve(k, MODEL, ASK)  # admitted at once on it
        r.settle()
        await hasty.shares.stop()
    finally:
        await slow.close()


class CutOff(SqliteStore):
    """A store this control plane can no longer renew its lease at (paused, or cut off)."""

    cut = False

    async def lease_keepalive(self, lease: int) -> float:
        if self.cut:
            await asyncio.Event().wait()  # never answers
        return await super().lease_keepalive(lease)


async def test_a_control_plane_that_cannot_renew_its_lease_stops_spending(
    tmp_path: Path,
) -> None:
    store = await CutOff.open(tmp_path / "state.db")
    assert isinstance(store, CutOff)
    try:
        p = await plane(store, ttl_s=0.4)
        p.shares.wait_s = 0.01
        k = key(budget_tokens=10**9)
        await hammer(p, k, each=1)
        assert p.answered == WORKERS  # it holds a share
        store.cut = True

        async def refused() -> bool:
            await hammer(p, k, each=1)
            return bool(p.refused)

        await eventually(refused)  # within 0.6 of the TTL after its last renewal
        assert p.codes == {"insufficient_quota"}
        await p.shares.stop(give_back=False)
    finally:
        await store.close()


async def test_a_share_taken_for_a_request_is_kept_until_idle(store: SqliteStore) -> None:
    """A refill that completes before its request comes back is not given back as idle."""
    p = await plane(store)  # idle_s 10
    limits = key(budget_tokens=10_000).limits
    refill = p.shares.check("k1", limits, 150, 0, 1, DAY)
    assert isinstance(refill, Refill)
    await refill.wait(5.0)
    await asyncio.sleep(0.2)  # twenty ticks of its tending
    assert (await ledger(store, ledgers.budget_key(DAY, "k1", "tokens"))).shares
    assert p.shares.check("k1", limits, 150, 0, 1, DAY) is None
    await p.shares.stop()


async def test_ledgers_of_ended_periods_are_deleted(store: SqliteStore) -> None:
    old = ["2025-02", "2025-02-28", "2025-03-01", "2025-03-03"]
    kept = ["2025-03", DAY]  # this month's and this day's
    for period in old + kept:
        await store.put(ledgers.budget_key(period, "k1", "tokens"), b"{}")
    p = await plane(store)

    async def swept() -> bool:
        kvs, _ = await store.range(ledgers.BUDGET, prefix_end(ledgers.BUDGET))
        return {kv.key for kv in kvs} == {ledgers.budget_key(d, "k1", "tokens") for d in kept}

    await eventually(swept)
    await p.shares.stop()


async def test_a_budget_held_by_another_plane_is_refused_for_now_not_for_the_day(
    store: SqliteStore,
) -> None:
    """A plane refused because the budget's rest is set aside by another plane's request in
    flight says so (not that it was used), lets the client retry soon
    (Retry-After about the idle give-back, not the end of the day), and passes once it can;
    a budget truly spent is refused until the next day."""
    k = key(budget_tokens=1500)
    a, b = await plane(store, idle_s=0.2), await plane(store, idle_s=0.2)
    try:
        await _held_then_spent(k, a, b)
    finally:
        for p in (a, b):
            await p.shares.stop()


async def _held_then_spent(k: ApiKey, a: Plane, b: Plane) -> None:
    held = await a.meter.reserve(k, MODEL, Estimate(prompt=700, completion=700))  # 1400
    with pytest.raises(ApiError) as refused:
        await b.meter.reserve(k, MODEL, ASK)
    e = refused.value
    print(e.detail.message, e.headers)
    assert e.status == 429 and e.detail.code == "insufficient_quota"
    assert "1500 tokens, is set aside for requests in flight" in e.detail.message
    assert "exceeded" not in e.detail.message and "renews" not in e.detail.message
    assert int(e.headers["Retry-After"]) <= 1 and "x-should-retry" not in e.headers
    held.tally.whole(200, ANSWER)
    held.settle()  # 100 used: a's share goes back once idle, and b's request then fits

    async def passes() -> bool:
        with contextlib.suppress(ApiError):
            (await b.meter.reserve(k, MODEL, ASK)).settle()
            return True
        return False

    await eventually(passes)
    await hammer(b, k)  # until spent
    with pytest.raises(ApiError) as spent:
        await b.meter.reserve(k, MODEL, ASK)
    assert int(spent.value.headers["Retry-After"]) > 3600  # noon: until the next day
    assert spent.value.headers["x-should-retry"] == "false"
