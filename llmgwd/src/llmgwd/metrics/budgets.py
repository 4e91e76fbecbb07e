"""Each budget's use against its limit, at every level that has one (a key, its user,
organization, team and project), worked out from the stored usage in the background."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from llmgwd.accounting.levels import Levels
from llmgwd.accounting.periods import day_id, month_of, period_id
from llmgwd.accounting.pricing import from_pico
from llmgwd.accounting.usage import Record, Usage
from llmgwd.catalog import KeyLimits, Period
from llmgwd.metrics.scrape import Fixed

log = logging.getLogger(__name__)

REFRESH_S = 60.0  # a month's usage rows read this often, not at each scrape
LEVEL_KINDS = ("key", "user", "org", "team", "project")
Budgeted = Callable[[], Iterable[tuple[str, KeyLimits]]]  # (level id or key id, its limits)


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
    records: Iterable[Record], idents: Callable[[str], Iterable[str]]
) -> dict[tuple[str, str], list[int]]:
    """Tokens and picos used per (key or level id, day or month id), each row counted for
    its key and every level above it (idents: a key id's levels, its own id first)."""
    used: dict[tuple[str, str], list[int]] = {}
    for r in records:
        tokens = r.counts.prompt_tokens + r.counts.completion_tokens
        for ident in idents(r.key_id):
            for pid in (r.day, month_of(r.day)):
                counts = used.setdefault((ident, pid), [0, 0])
                counts[0] += tokens
                counts[1] += r.counts.spend_pico
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
        levels: Levels,
        usage: Usage,
        *,
        wall: Callable[[], float] = time.time,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self._keys, self._levels, self._usage = keys, levels, usage
        self._wall, self.refresh_s = wall, refresh_s
        self.budgets: tuple[Budget, ...] = ()

    async def refresh(self) -> None:
        """Read this month's usage (when some level has a budget) and work out each budget's."""
        budgeted = [*self._keys(), *self._levels.budgeted()]
        day = day_id(self._wall())
        if not any(b for _, limits in budgeted for b in budgets_of(limits)):
            self.budgets = ()
            return
        records = await self._usage.records(month_of(day) + "-01")
        chain = self._levels.of_key_id
        used = tally(records, lambda key: (key, *(i for i, _ in chain(key).levels)))
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


def families(budgets: tuple[Budget, ...]) -> Iterator[Metric]:
    """llmgw_budget_limit and llmgw_budget_used, one series of each per budget."""
    labels = ["level", "name", "budget", "period"]
    limit = GaugeMetricFamily("llmgw_budget_limit", "A budget's limit per period: tokens, or "
                              "money in the prices' currency.", labels=labels)  # fmt: skip
    used = GaugeMetricFamily("llmgw_budget_used", "What the budget's current period (UTC) has "
                             "used of it, as its limit counts.", labels=labels)  # fmt: skip
    for b in budgets:
        limit.add_metric([b.level, b.name, b.budget, b.period], b.limit)
        used.add_metric([b.level, b.name, b.budget, b.period], b.used)
    yield from (limit, used)
