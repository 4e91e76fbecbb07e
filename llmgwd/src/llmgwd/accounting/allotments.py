"""This control plane's shares of each key's budgets and rates, taken from the store by
compare-and-set and spent in memory: a request never waits on the store unless its share is
short.

Each pot (a key's token or spend budget in its period, its requests or tokens per minute) is
one ledger in the store (accounting.allotment_ledger). A control plane takes a share of what
the pot has left, admits requests against it alone, and steps the ledger again in the background
when the share falls under its low-water mark (half of the share it aims at: lead_s of its
recent use, at least four of its largest request and a 64th of the limit; never more than
half of what is free), reporting what it used and taking more. It gives back what it holds
after idle_s without a request, and on stop. Shares are tied to a store lease: a control
plane that dies holding one may have admitted requests on all of it and reported none, so when
its lease runs out (ttl_s) the next step on the pot counts a budget's share as spent, whole
(what it left unused is lost to the period), and a rate's as used for one more window. A
control plane spends its shares only until TRUST of the TTL after the last renewal it sent, so
a paused or cut-off one cannot spend a share that was taken back; if its lease did run out, it
takes a new one and reports nothing more of what it used of the old share (counted already).

Bounds. Budgets: the sum of every share and every reported use never exceeds the budget, so
the cluster never spends more than it, a dead control plane's share included (except by what
a request used past its reservation on a share counted whole). Rates: a
request counts from its admission until a window after its control plane reported it (at a
later step), and shares held count in full, so any 60 s window admits at most N requests (or
tokens) through all control planes together, plus what the clocks' skew between control
planes lets expire early (N + k x (control planes - 1) with k = 0 when the clocks agree);
per-process counting let N through each control plane. A request whose share is short while
a refill is under way waits for it (Meter.reserve, at most wait_s); then, or when the pot had
nothing more at its last step (for dry_s), it gets the usual budget or rate 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field

import msgspec

from llmgwd.accounting import allotment_ledger as ledgers
from llmgwd.accounting.budgets import Exhausted
from llmgwd.accounting.periods import Today, month_of, period_id
from llmgwd.accounting.pricing import to_pico
from llmgwd.accounting.rates import Refusal
from llmgwd.accounting.shares import Refill
from llmgwd.accounting.usage import USAGE, Counts, parse_key
from llmgwd.catalog import KeyLimits, Period
from llmgwd.store import Compare, Delete, Put, Store, prefix_end

log = logging.getLogger(__name__)

MAX_TRIES = 20  # compare-and-set rounds of one step before it gives up until the next
TRUST = 0.6  # shares are used until this part of the lease's TTL after the last renewal sent
GIVE_BACK_AT_ONCE = 64  # steps under way together when giving every share back
FLOOR_PARTS = 64  # a share aims at least at this part of its limit (half of what is free at most)


@dataclass(slots=True, eq=False)
class Pot:
    """What this control plane holds of one pot, and what it did with it since its last step."""

    key: str  # the ledger's store key
    what: str  # "tokens" or "spend" (a budget), "requests" or "tokens" (a rate)
    period: Period | None  # a budget's; None for a rate
    pid: str  # a budget's period id (a day or month id); "" for a rate
    limit: int
    held: int = 0  # the share the ledger gives this control plane
    consumed: int = 0  # used from it since the last step
    reserved: int = 0  # reserved on it by requests in flight
    biggest: int = 0  # the largest request seen
    taken: int = 0  # reserved since the last step: the recent use
    low: int = 0  # refill once what is left falls under this
    stepped_at: float = 0.0
    used_at: float = field(default_factory=time.monotonic)  # (made for a request: now)
    dry_until: float = 0.0  # the last step had nothing more: no refill before this
    seen_used: int = 0  # what the cluster had used at the last step, shares held included
    seen_spent: int = 0  # a budget's use reported by every holder, at the last step
    seen_next: float = 0.0  # a rate's: wall time its oldest reported use leaves the window
    returning: bool = False  # a give-back is under way: nothing is taken meanwhile
    lost: int = 0  # times a budget's share was taken back as a dead holder's (counted spent)
    refill: asyncio.Task[None] | None = None

    @property
    def rate(self) -> bool:
        return self.period is None

    def available(self) -> int:
        return self.held - self.consumed - self.reserved


# What one request reserved: (pot, amount, what settles it: 0 tokens, 1 picos, 2 requests,
# the pot's lost count when reserved).
Ticket = list[tuple[Pot, int, int, int]]


class Allotments:
    """The Shares the Meter spends; start() before serving, stop() gives everything back."""

    def __init__(
        self,
        store: Store,
        *,
        ttl_s: float = 10.0,
        lead_s: float = 10.0,
        idle_s: float = 10.0,
        dry_s: float = 1.0,
        wait_s: float = 2.0,
        tick_s: float = 0.2,
        wall: Callable[[], float] = time.time,
        keys_in: Callable[[str], set[str]] | None = None,
    ) -> None:
        self.wait_s = wait_s
        self._keys_in = keys_in  # the keys under a level (accounting.levels), for its stored usage
        self._store = store
        self._ttl_s, self._lead_s, self._idle_s, self._dry_s = ttl_s, lead_s, idle_s, dry_s
        self._tick_s = tick_s
        self._wall = wall
        self._today = Today()
        self._pots: dict[str, Pot] = {}
        self._lease = 0
        self._valid_until = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self.steps = 0  # ledger writes made (each a compare-and-set that held)

    @property
    def holder(self) -> str:
        return str(self._lease)

    async def start(self) -> None:
        """Take a lease, say this control plane is alive, and start tending the shares."""
        await self._relet()
        self._tasks = [asyncio.create_task(self._keepalive()), asyncio.create_task(self._tend())]

    async def stop(self, *, give_back: bool = True) -> None:
        """Stop tending; give every share back and end the lease (unless give_back is False:
        as a control plane killed outright, whose steps under way die with it and whose shares
        are taken back when its lease expires)."""
        for task in self._tasks:
            task.cancel()
        for pot in self._pots.values():
            if pot.refill and not give_back:
                pot.refill.cancel()
        for task in [*self._tasks, *(p.refill for p in self._pots.values() if p.refill)]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if not give_back:
            return
        pots = list(self._pots.values())
        for i in range(0, len(pots), GIVE_BACK_AT_ONCE):
            steps = [self._step(p, 0, give_back=True) for p in pots[i : i + GIVE_BACK_AT_ONCE]]
            await asyncio.gather(*steps, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._store.lease_revoke(self._lease)

    def check(
        self,
        key_id: str,
        limits: KeyLimits,
        tokens: int,
        picos: int,
        requests: int,
        day: str,
        wait: bool = True,
    ) -> Exhausted | Refusal | Refill | None:
        """None when the request fits every share; a Refill (when wait) when one is short and
        more can come; else the refusal of the first short pot."""
        now = time.monotonic()
        usable = now < self._valid_until
        pending = []
        for pot, need, _, _ in self._needs(key_id, limits, tokens, picos, requests, day):
            if usable and not pot.returning and pot.available() >= need:
                continue
            if pot.dry_until > now and not pot.returning:
                return self._refusal(pot, need)
            task = self._refill(pot, need)
            if not wait:
                return self._refusal(pot, need)
            pending.append(task)
        return Refill(pending) if pending else None

    def take(
        self, key_id: str, limits: KeyLimits, tokens: int, picos: int, requests: int, day: str
    ) -> Ticket:
        """Reserve the request on every share it needs (after check said it fits)."""
        now = time.monotonic()
        ticket = self._needs(key_id, limits, tokens, picos, requests, day)
        for pot, need, _, _ in ticket:
            pot.reserved += need
            pot.taken += need
            pot.biggest = max(pot.biggest, need)
            pot.used_at = now
            if pot.available() < pot.low:
                self._refill(pot, 0)
        return ticket

    def settle(self, ticket: object, tokens: int, picos: int) -> None:
        """Release a ticket's reservations and count what its request used."""
        assert isinstance(ticket, list)
        for pot, need, which, lost in ticket:
            pot.reserved -= need
            used = (tokens, picos, need)[which]
            # On a share since counted as spent, whole: only what it used past its reservation.
            pot.consumed += used if lost == pot.lost else max(0, used - need)

    def _needs(
        self, key_id: str, limits: KeyLimits, tokens: int, picos: int, requests: int, day: str
    ) -> Ticket:
        """Each pot a request of a key needs, with how much and what settles it."""
        out: Ticket = []
        if limits.budget_tokens:
            pot = self._budget(key_id, "tokens", limits.budget_tokens_per, day)
            out.append((self._limit(pot, limits.budget_tokens), tokens, 0, pot.lost))
        if limits.budget_spend:
            pot = self._budget(key_id, "spend", limits.budget_spend_per, day)
            out.append((self._limit(pot, to_pico(limits.budget_spend)), picos, 1, pot.lost))
        if limits.rpm:
            pot = self._limit(self._rate(key_id, "requests"), limits.rpm)
            out.append((pot, requests, 2, 0))
        if limits.tpm:
            out.append((self._limit(self._rate(key_id, "tokens"), limits.tpm), tokens, 0, 0))
        return out

    def _budget(self, key_id: str, what: str, period: Period, day: str) -> Pot:
        key = ledgers.budget_key(period_id(period, day), key_id, what)
        pot = self._pots.get(key)
        if pot is None:
            pot = self._pots[key] = Pot(key, what, period, period_id(period, day), 0)
        return pot

    def _rate(self, key_id: str, what: str) -> Pot:
        key = ledgers.rate_key(key_id, what)
        pot = self._pots.get(key)
        if pot is None:
            pot = self._pots[key] = Pot(key, what, None, "", 0)
        return pot

    @staticmethod
    def _limit(pot: Pot, limit: int) -> Pot:
        pot.limit = limit  # the key's limits as the catalog has them now
        return pot

    def _refusal(self, pot: Pot, need: int) -> Exhausted | Refusal:
        if pot.period is not None:
            spent = pot.seen_spent + pot.consumed
            if spent + need <= pot.limit:  # the rest is in shares: they settle or come back
                return Exhausted(pot.what, pot.period, pot.limit, spent, need, self._idle_s)
            return Exhausted(pot.what, pot.period, pot.limit, spent, need)
        wait = max(self._dry_s, pot.seen_next - self._wall()) if pot.seen_next else self._dry_s
        return Refusal(pot.what, pot.limit, pot.seen_used, need, wait)

    def _refill(self, pot: Pot, need: int) -> asyncio.Task[None]:
        """The refill under way for pot, or a new one for at least need more."""
        if pot.refill is None:
            _run(pot, self._step_logged(pot, need, give_back=False))
        assert pot.refill is not None
        return pot.refill

    async def _step_logged(self, pot: Pot, need: int, *, give_back: bool) -> None:
        try:
            await self._step(pot, need, give_back=give_back)
        except Exception:
            log.exception("allotment step on %s failed", pot.key)  # no secret in a pot's key
            pot.dry_until = time.monotonic() + self._dry_s

    def _want(self, pot: Pot, need: int) -> int:
        """The share to hold after a refill: never less than now (requests are admitted on it
        meanwhile), enough for need, and the aim: lead_s of recent use, at least four of the
        largest request and a 64th of the limit."""
        now = time.monotonic()
        elapsed = max(now - pot.stepped_at, self._tick_s) if pot.stepped_at else self._lead_s
        recent = int(pot.taken * self._lead_s / elapsed)
        aim = max(4 * max(pot.biggest, need), recent, pot.limit // FLOOR_PARTS)
        pot.low = aim // 2
        return max(pot.held - pot.consumed, pot.reserved + max(aim, need))

    async def _step(self, pot: Pot, need: int, *, give_back: bool) -> None:
        """Report what pot used and take its share (or give it back), by compare-and-set."""
        pot.returning = give_back
        try:
            for _ in range(MAX_TRIES):
                if await self._try_step(pot, 0 if give_back else self._want(pot, need), need):
                    return
            raise RuntimeError(f"the ledger {pot.key} kept changing under {MAX_TRIES} steps")
        finally:
            pot.returning = False

    async def _try_step(self, pot: Pot, want: int, need: int) -> bool:
        """One compare-and-set round; whether it held (or had nothing to change)."""
        store, holder = self._store, self.holder
        kv = await store.get(pot.key)
        ledger = ledgers.decode(kv.value) if kv else ledgers.Ledger(spent=await self._before(pot))
        if pot.held and holder not in ledger.shares and not pot.rate:
            _lost(pot)  # taken back (so counted as spent) while this plane's lease had lapsed
        dead = {h for h in ledger.shares if h != holder and await self._dead(h)}
        consumed, wall, had = pot.consumed, self._wall(), pot.held - pot.consumed
        least = min(want, pot.held - consumed + need)
        move = ledgers.Move(holder, consumed, pot.reserved, want, least, pot.limit, pot.rate, wall)
        after, share = ledgers.step(ledger, move, dead)
        if after != ledger:
            same = Compare(pot.key, "mod", "=", kv.mod_revision) if kv else _absent(pot.key)
            empty = after == ledgers.Ledger()
            write = Delete(pot.key) if empty else Put(pot.key, ledgers.encode(after))
            if not (await store.txn([same], [write])).succeeded:
                return False
            self.steps += 1
        pot.consumed = max(0, pot.consumed - consumed)  # (0 when _relet ran meanwhile)
        if holder != self.holder:  # a new lease meanwhile: the share is a dead holder's
            return True
        pot.held = share
        pot.taken = 0
        pot.stepped_at = time.monotonic()
        pot.seen_used = ledgers.used(after, wall) - share + pot.consumed + pot.reserved
        pot.seen_spent = after.spent
        pot.seen_next = min((until for _, until in after.recent), default=0.0)
        if share < want and (share <= had or pot.available() < need):
            pot.dry_until = pot.stepped_at + self._dry_s  # the pot has nothing more for now
        return True

    async def _dead(self, holder: str) -> bool:
        return await self._store.get(ledgers.live_key(holder)) is None

    async def _before(self, pot: Pot) -> int:
        """What a new budget pot starts from: the stored usage of its key, or of every key
        under its level, in its period."""
        if pot.period is None:
            return 0
        owner = pot.key[len(ledgers.BUDGET) :].split("/")[1]
        level = ":" in owner  # a level's id (org:ORG, ...); a key's has no colon
        keys = self._keys_in(owner) if level and self._keys_in is not None else {owner}
        period = pot.pid
        days = [period] if len(period) == 10 else [f"{period}-{d:02d}" for d in range(1, 32)]
        total = 0
        for day in days:
            prefix = f"{USAGE}{day}/" if level else f"{USAGE}{day}/{owner}/"
            kvs, _ = await self._store.range(prefix, prefix_end(prefix))
            for kv in kvs:
                if level and parse_key(kv.key)[1] not in keys:
                    continue
                c = msgspec.json.decode(kv.value, type=Counts)
                total += c.prompt_tokens + c.completion_tokens if pot.what == "tokens" else 0
                total += c.spend_pico if pot.what == "spend" else 0
        return total

    async def _relet(self) -> None:
        """A new lease and the key saying its holder is alive; the old one's shares are gone."""
        started = time.monotonic()
        self._lease = await self._store.lease_grant(self._ttl_s)
        await self._store.put(ledgers.live_key(self.holder), b"", lease=self._lease)
        self._valid_until = started + self._ttl_s * TRUST
        for pot in self._pots.values():
            if pot.rate:  # taken back as a dead holder's; what it used is reported next step
                pot.held = 0
            else:
                _lost(pot)

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(self._ttl_s / 4)
            started = time.monotonic()
            try:
                await self._store.lease_keepalive(self._lease)
                self._valid_until = started + self._ttl_s * TRUST
            except KeyError:
                log.warning("allotments' lease expired; its shares were taken back")
                with contextlib.suppress(Exception):
                    await self._relet()
            except Exception:
                log.exception("allotments' lease keepalive failed")

    async def _tend(self) -> None:
        """Refill shares under their low-water mark, give back idle ones, forget ended ones,
        and each day delete the ledgers of the periods that ended."""
        swept = ""
        while True:
            await asyncio.sleep(self._tick_s)
            day = self._today.at(self._wall())
            self._tend_once(time.monotonic(), day)
            if day != swept:
                try:
                    await self._sweep(day)
                    swept = day
                except Exception:
                    log.exception("deleting the ended periods' allotments failed")

    async def _sweep(self, day: str) -> None:
        """Delete the budget ledgers of every period before day and its month (ids sort so:
        the months before, then this month's days before day)."""
        month = month_of(day)
        await self._store.delete(ledgers.BUDGET, ledgers.BUDGET + month)
        await self._store.delete(ledgers.BUDGET + month + "-", ledgers.BUDGET + day)

    def _tend_once(self, now: float, day: str) -> None:
        current = {day, month_of(day)}
        for key, pot in list(self._pots.items()):
            if pot.refill is not None:
                continue
            if pot.pid and pot.pid not in current:
                del self._pots[key]  # its period ended: the ledger is left behind
            elif now - pot.used_at > self._idle_s:
                if pot.held or pot.consumed:
                    _run(pot, self._step_logged(pot, 0, give_back=True))
                elif not pot.reserved:
                    del self._pots[key]
            elif pot.available() < pot.low and pot.dry_until < now and now < self._valid_until:
                self._refill(pot, 0)


def _run(pot: Pot, step: Coroutine[None, None, None]) -> None:
    """Run a step of pot in the background, as its refill under way until it ends."""

    def done(_: asyncio.Task[None]) -> None:
        pot.refill = None

    pot.refill = asyncio.create_task(step)
    pot.refill.add_done_callback(done)


def _lost(pot: Pot) -> None:
    """A budget's share was (or will be, as its holder's lease is gone) taken back as a dead
    holder's and counted as spent, whole: what this plane used of it is no longer to report,
    nor what requests still in flight on it will use (past their reservations: see settle)."""
    pot.consumed = max(0, pot.consumed - pot.held)
    pot.held = 0
    pot.lost += 1


def _absent(key: str) -> Compare:
    return Compare(key, "version", "=", 0)
