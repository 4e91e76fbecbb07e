"""Each budget's use against its limit, at every level that has one (a key, its user,
organization, team and project), worked out from the stored usage in the background: the
month's rows read from the store a day at a time, decoded and summed in a worker thread
(60,000 rows take about half a second of CPU, which the event loop must not wait on)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import msgspec
from prometheus_client.core import GaugeMetricFamily, Metric

from llmgwd.accounting.levels import Levels
from llmgwd.accounting.periods import day_id, month_of, period_id
from llmgwd.accounting.pricing import from_pico
from llmgwd.accounting.usage import USAGE, Counts, parse_key
from llmgwd.catalog import KeyLimits, Period
from llmgwd.metrics.scrape import Fixed
from llmgwd.store import KV, Store, prefix_end

log = logging.getLogger(__name__)

REFRESH_S = 60.0  # a month's usage rows read this often, not at each scrape
LEVEL_KINDS = ("key", "user", "org", "team", "project")
Budgeted = Callable[[], Iterable[tuple[str, KeyLimits]]]  # (level id or key id, its limits)
KeyIds = Callable[[], Iterable[str]]  # every key's id, revoked ones too (their use counts above)
_counts = msgspec.json.Decoder(Counts)


@dataclass(frozen=True, slots=True)
class Budget:
    """One budget and what its period has used of it."""

    level: str  # one of LEVEL_KINDS
    name: str  # a key's id; acme, acme/research, ... for the levels above
    budget: str  # "tokens" or "spend" (in the prices' currency)
    period: str  # "day" or "month"
    limit: float
    used: float


def level_of(ident: str) -> tuple[str, str]:
    """A key's id or a level's id (org:ORG, team:ORG:TEAM, ...) as its kind and name."""
    kind, _, rest = ident.partition(":")
    return ("key", ident) if not rest else (kind, rest.replace(":", "/"))


def budgets_of(limits: KeyLimits) -> Iterator[tuple[str, Period, float]]:
    """A level's budgets: what each counts, its period and its limit."""
    if limits.budget_tokens:
        yield "tokens", limits.budget_tokens_per, float(limits.budget_tokens)
    if limits.budget_spend:
        yield "spend", limits.budget_spend_per, limits.budget_spend


def tally(
    rows: Sequence[KV], idents: Mapping[str, tuple[str, ...]]
) -> dict[tuple[str, str], list[int]]:
    """Tokens and picos used per (key or level id, day or month id), each stored usage row
    counted for its key and every level above it (idents: by key id, its own id first; a
    key not there counts for itself). Runs in a worker thread."""
    used: dict[tuple[str, str], list[int]] = {}
    for kv in rows:
        day, key_id, _ = parse_key(kv.key)
        c = _counts.decode(kv.value)
        tokens = c.prompt_tokens + c.completion_tokens
        for ident in idents.get(key_id, (key_id,)):
            for pid in (day, month_of(day)):
                counts = used.setdefault((ident, pid), [0, 0])
                counts[0] += tokens
                counts[1] += c.spend_pico
    return used


def rows(
    budgeted: Iterable[tuple[str, KeyLimits]], used: dict[tuple[str, str], list[int]], day: str
) -> tuple[Budget, ...]:
    """Every budget with its period's use (the period holding day)."""
    out = []
    for ident, limits in budgeted:
        level, name = level_of(ident)
        for what, period, limit in budgets_of(limits):
            tokens, picos = used.get((ident, period_id(period, day)), (0, 0))
            spent = float(tokens) if what == "tokens" else from_pico(picos)
            out.append(Budget(level, name, what, period, limit, spent))
    return tuple(sorted(out, key=lambda b: (b.level, b.name, b.budget, b.period)))


class BudgetSeries:
    """The budgets' series, from a copy refreshed every REFRESH_S (a scrape reads the copy)."""

    def __init__(
        self,
        keys: Budgeted,
        key_ids: KeyIds,
        levels: Levels,
        store: Store,
        *,
        wall: Callable[[], float] = time.time,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self._keys, self._key_ids, self._levels, self._store = keys, key_ids, levels, store
        self._wall, self.refresh_s = wall, refresh_s
        self.budgets: tuple[Budget, ...] = ()

    async def refresh(self) -> None:
        """Read this month's stored usage (when some level has a budget) and work out each
        budget's (what a control plane has not flushed yet, at most usage's 5 s, waits)."""
        budgeted = [*self._keys(), *self._levels.budgeted()]
        day = day_id(self._wall())
        if not any(b for _, limits in budgeted for b in budgets_of(limits)):
            self.budgets = ()
            return
        chain = self._levels.of_key_id  # on the loop: the levels change there
        idents = {k: (k, *(i for i, _ in chain(k).levels)) for k in self._key_ids()}
        kvs: list[KV] = []
        for n in range(1, int(day[8:]) + 1):  # a day at a time: no one long read on the loop
            prefix = f"{USAGE}{month_of(day)}-{n:02d}/"
            kvs += (await self._store.range(prefix, prefix_end(prefix)))[0]
        used = await asyncio.to_thread(tally, kvs, idents)
        self.budgets = rows(budgeted, used, day)

    async def run(self) -> None:
        """Refresh now and every refresh_s (a store that does not answer keeps the last)."""
        while True:
            try:
                await self.refresh()
            except Exception as e:  # kept running: the series go stale, not away
                log.warning("the budgets' series not refreshed: %s", e)
            await asyncio.sleep(self.refresh_s)

    def snapshot(self) -> Fixed[tuple[Budget, ...]]:
        """The last refresh's budgets, their series built wherever they are collected."""
        return Fixed(families, self.budgets)


# Each budget's pair of series by what it counts: the unit in the name (tokens, or whole
# units of the prices' currency, as llmgw_spend_currency_units_total), not in a label.
_NAMES = {
    "tokens": ("llmgw_budget_tokens", "tokens"),
    "spend": ("llmgw_budget_spend_currency_units", "whole units of the prices' currency"),
}


def families(budgets: tuple[Budget, ...]) -> Iterator[Metric]:
    """llmgw_budget_tokens_limit and _used, llmgw_budget_spend_currency_units_limit and _used:
    one series of each pair per budget of that kind."""
    pairs = {what: _pair(name, unit) for what, (name, unit) in _NAMES.items()}
    for b in budgets:
        limit, used = pairs[b.budget]
        limit.add_metric([b.level, b.name, b.period], b.limit)
        used.add_metric([b.level, b.name, b.period], b.used)
    for limit, used in pairs.values():
        yield from (limit, used)


def _pair(name: str, unit: str) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    """A kind of budget's limit and use, each by level, name and period."""
    labels = ["level", "name", "period"]
    limit = GaugeMetricFamily(f"{name}_limit", f"A budget's limit per period, in {unit}.",
                              labels=labels)  # fmt: skip
    used = GaugeMetricFamily(f"{name}_used", "What the budget's current period (UTC) has used "
                             f"of it, in {unit}.", labels=labels)  # fmt: skip
    return limit, used
