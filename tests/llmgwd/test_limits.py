"""Rate windows and budgets on their own, on a clock the test moves."""

from __future__ import annotations

import pytest

from llmgwd.accounting.budgets import Budgets
from llmgwd.accounting.pricing import to_pico
from llmgwd.accounting.rates import RateLimits, Window
from llmgwd.catalog import KeyLimits

T0 = 1000.25  # any monotonic time, not on a second's boundary


def test_window_forgets_what_is_older_than_a_minute() -> None:
    w = Window()
    w.add(T0, 5)
    w.add(T0 + 30, 7)
    assert w.used(T0 + 30) == 12
    assert w.used(T0 + 59.5) == 12
    assert w.used(T0 + 60) == 7  # the first second left the window
    assert w.used(T0 + 90) == 0
    assert w.used(T0 + 5000) == 0


def test_window_take_back_only_while_still_counted() -> None:
    w = Window()
    second = w.add(T0, 10)
    w.take_back(second, T0 + 1, 4)
    assert w.used(T0 + 1) == 6
    w.take_back(second, T0 + 61, 6)  # that second is gone: nothing to take back from
    assert w.used(T0 + 61) == 0
    w.add(T0 + 61, 3)
    assert w.used(T0 + 61) == 3


def test_window_says_when_room_frees_and_when_it_is_empty() -> None:
    w = Window()
    w.add(T0, 6)  # second 1000, leaves at 1060
    w.add(T0 + 10, 4)  # second 1010, leaves at 1070
    now = T0 + 20
    assert w.free_in(now, 0, 10) == 0.0
    assert w.free_in(now, 3, 10) == pytest.approx(1060 - now)
    assert w.free_in(now, 7, 10) == pytest.approx(1070 - now)
    assert w.free_in(now, 11, 10) is None  # larger than the limit: never
    assert w.empty_in(now) == pytest.approx(1070 - now)
    assert Window().empty_in(now) == 0.0


def test_rate_limits_check_take_settle() -> None:
    limits = KeyLimits(rpm=3, tpm=100)
    rl = RateLimits()
    assert rl.check("k", limits, 60, T0) is None
    second = rl.take("k", limits, 60, T0)
    assert second is not None
    refusal = rl.check("k", limits, 60, T0)
    assert refusal is not None
    assert (refusal.kind, refusal.limit, refusal.used, refusal.requested) == ("tokens", 100, 60, 60)
    assert refusal.retry_after_s == pytest.approx(60 - 0.25)
    rl.settle("k", second, 60, 15, T0 + 1)  # it used 15 of the 60 reserved
    assert rl.check("k", limits, 60, T0 + 1) is None
    states = {s.kind: s for s in rl.states("k", limits, T0 + 1)}
    assert (states["tokens"].remaining, states["requests"].remaining) == (85, 2)
    for _ in range(2):
        rl.take("k", limits, 1, T0 + 2)
    refusal = rl.check("k", limits, 1, T0 + 2)
    assert refusal is not None and refusal.kind == "requests"
    assert rl.check("k", limits, 101, T0 + 120) is not None  # too large, window empty or not


def test_keys_without_limits_have_no_window() -> None:
    rl = RateLimits()
    assert rl.take("k", KeyLimits(), 10**9, T0) is None
    assert rl.check("k", KeyLimits(), 10**9, T0) is None
    assert rl.states("k", KeyLimits(), T0) == []


def test_budget_counts_reservations_then_what_was_used() -> None:
    limits = KeyLimits(budget_tokens=1000, budget_tokens_per="day")
    b = Budgets()
    day = "2025-03-04"
    assert b.check("k", limits, 600, 0, day) is None
    b.take("k", 600, 0)
    exhausted = b.check("k", limits, 600, 0, day)
    assert exhausted is not None
    assert (exhausted.what, exhausted.used, exhausted.requested) == ("tokens", 600, 600)
    b.settle("k", (600, 0), 100, 0, day)
    assert b.used("k", day) == (100, 0)
    assert b.check("k", limits, 900, 0, day) is None
    assert b.check("k", limits, 901, 0, day) is not None
    assert b.check("k", limits, 901, 0, "2025-03-05") is None  # a new day, a new budget


def test_month_budget_spans_days_and_ends_with_the_month() -> None:
    limits = KeyLimits(budget_spend=1.0, budget_spend_per="month")
    b = Budgets()
    b.add("k", "2025-03-01", 10, to_pico(0.4))
    b.add("k", "2025-03-20", 10, to_pico(0.5))
    assert b.used("k", "2025-03") == (20, to_pico(0.9))
    assert b.check("k", limits, 0, to_pico(0.1), "2025-03-21") is None
    spent = b.check("k", limits, 0, to_pico(0.11), "2025-03-21")
    assert spent is not None and spent.what == "spend"
    b.add("k", "2025-04-01", 1, 1)
    assert b.used("k", "2025-03") == (0, 0)  # forgotten once it ended
    assert b.check("k", limits, 0, to_pico(0.99), "2025-04-01") is None
