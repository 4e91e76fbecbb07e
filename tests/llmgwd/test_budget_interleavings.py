"""Budgets and the Meter under any interleaving of admissions and settlements, against an exact
ledger (issue 26, finding 3: the first zero-token request to settle deleted its key's entry)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgwd.accounting.budgets import Budgets
from llmgwd.catalog import ApiKey, KeyLimits, Model
from llmgwd.router.metering import Meter
from llmgwd.router.token_bounds import Estimate

DAY = "2026-12-05"
LIMITS = KeyLimits(budget_tokens=5_000, budget_tokens_per="day")
KEYS = ("a", "b")


@dataclass
class Ledger:
    """What the budgets must hold: settled use, and each request in flight's reservation."""

    used: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KEYS, 0))
    flying: list[tuple[str, int, int]] = field(default_factory=list)  # key, tokens, picos

    def reserved(self, key: str) -> tuple[int, int]:
        mine = [(t, p) for k, t, p in self.flying if k == key]
        return sum(t for t, _ in mine), sum(p for _, p in mine)


# An operation: admit (key index, tokens, picos), or settle (which request in flight, the share
# of its reservation it used).
_admit = st.tuples(st.just("admit"), st.sampled_from(KEYS), st.sampled_from((0, 0, 1, 300, 900)),
                   st.sampled_from((0, 0, 7)))  # fmt: skip
_settle = st.tuples(st.just("settle"), st.integers(0, 50), st.sampled_from((0.0, 0.5, 1.0)),
                    st.just(0))  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_admit, _settle), max_size=60))
def test_budgets_follow_the_exact_ledger_in_any_order(
    ops: list[tuple[str, object, object, object]],
) -> None:
    b, ledger = Budgets(), Ledger()
    for op, a1, a2, a3 in ops:
        if op == "admit":
            key, tokens, picos = str(a1), int(str(a2)), int(str(a3))
            refused = b.check(key, LIMITS, tokens, picos, DAY) is not None
            total = ledger.used[key] + ledger.reserved(key)[0] + tokens
            assert refused == (total > LIMITS.budget_tokens)
            if not refused:
                b.take(key, tokens, picos)
                ledger.flying.append((key, tokens, picos))
        elif ledger.flying:
            key, tokens, picos = ledger.flying.pop(int(str(a1)) % len(ledger.flying))
            spent = int(tokens * float(str(a2)))
            b.settle(key, (tokens, picos), spent, 0, DAY)
            ledger.used[key] += spent
        for key in KEYS:
            assert b.reserved(key) == ledger.reserved(key)
            assert b.used(key, DAY)[0] == ledger.used[key]


def test_zero_token_requests_settle_in_any_order() -> None:
    """Two requests that reserve nothing (a count of tokens, a transcription): the first to
    settle used to delete the key's entry, and the second's settle raised KeyError (a 500)."""
    b = Budgets()
    b.take("k", 0, 0)
    b.take("k", 0, 0)
    b.settle("k", (0, 0), 0, 0, DAY)
    b.settle("k", (0, 0), 0, 0, DAY)
    assert b.reserved("k") == (0, 0)


def test_meter_settles_concurrent_requests_that_reserve_nothing() -> None:
    """Eight requests of one key in flight together, each reserving no token, settled as they
    end: none raises, and nothing stays reserved."""
    meter = Meter()
    key = ApiKey(id="k1", name="k1", hash="00" * 32, prefix="sk", limits=LIMITS)
    model = Model(name="m", source="file:/m.gguf")

    async def one(i: int) -> None:
        reservation = meter.admit(key, model, Estimate(prompt=0, completion=0))
        await asyncio.sleep(0.001 * (i % 3))
        reservation.settle()

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(8)))

    asyncio.run(main())
    assert meter.budgets.reserved("k1") == (0, 0)
