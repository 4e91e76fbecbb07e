"""The limit options of `llmgw key create` and `llmgw key limits`, and how limits are shown."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import click

from llmgw.api_types import KeyLimits, LimitsIn, Period

F = TypeVar("F", bound=Callable[..., Any])
PERIODS = ("day", "month")


class BudgetType(click.ParamType[tuple[float | int, str], Any]):
    """AMOUNT/day or AMOUNT/month (a bare AMOUNT is per day; 0 removes the budget)."""

    name = "budget"

    def __init__(self, amount: Callable[[str], float | int]) -> None:
        self._amount = amount

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[float | int, str]:
        """The (amount, period) of the option's text."""
        if isinstance(value, tuple):
            return value
        text, _, period = str(value).partition("/")
        period = period or "day"
        try:
            amount = self._amount(text)
        except ValueError:
            self.fail(f"{value!r} is not AMOUNT/day or AMOUNT/month", param, ctx)
        if period not in PERIODS or amount < 0:
            self.fail(f"{value!r} is not AMOUNT/day or AMOUNT/month", param, ctx)
        return amount, period


def limit_options(f: F) -> F:
    """--rpm, --tpm, --budget-tokens and --budget-spend."""
    options = [
        click.option("--rpm", type=click.IntRange(min=0), help="Requests per minute (0: none)."),
        click.option(
            "--tpm", type=click.IntRange(min=0), help="Tokens per minute, prompt and completion."
        ),
        click.option(
            "--budget-tokens",
            type=BudgetType(int),
            metavar="N/day|month",
            help="Tokens a day or a month, e.g. 1000000/day (0: none).",
        ),
        click.option(
            "--budget-spend",
            type=BudgetType(float),
            metavar="X/day|month",
            help="Spend a day or a month at the models' prices, e.g. 20/month (0: none).",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def limits_body(
    rpm: int | None,
    tpm: int | None,
    budget_tokens: tuple[int, str] | None,
    budget_spend: tuple[float, str] | None,
) -> LimitsIn:
    """The API's limits change with just the options given (None: kept as it is)."""
    tokens, tokens_per = budget_tokens or (None, None)
    spend, spend_per = budget_spend or (None, None)
    return LimitsIn(
        rpm=rpm,
        tpm=tpm,
        budget_tokens=tokens,
        budget_tokens_per=cast(Period | None, tokens_per),  # BudgetType gives day or month
        budget_spend=spend,
        budget_spend_per=cast(Period | None, spend_per),
    )


def describe(limits: KeyLimits) -> str:
    """Limits in a few words: "60 rpm, 10000 tpm, 1000000 tokens/day, 20 spend/month"."""
    parts = [f"{n} {k}" for k, n in (("rpm", limits.rpm), ("tpm", limits.tpm)) if n]
    if limits.budget_tokens:
        parts.append(f"{limits.budget_tokens} tokens/{limits.budget_tokens_per}")
    if limits.budget_spend:
        parts.append(f"{limits.budget_spend:g} spend/{limits.budget_spend_per}")
    return ", ".join(parts) or "none"
