"""Money as exact integers: prices per million tokens become picos (1e-12 units) per token."""

from __future__ import annotations

from llmgwd.catalog import Model

PICO = 10**12


def to_pico(amount: float) -> int:
    """An amount of money as whole picos (sums and comparisons stay exact)."""
    return round(amount * PICO)


def from_pico(pico: int) -> float:
    """Picos as an amount of money, for people."""
    return pico / PICO


def per_token(price_per_million: float) -> int:
    """A price per million tokens as picos per token (1e-6 of a unit per million is exact)."""
    return round(price_per_million * 1_000_000)


def cost(model: Model, prompt_tokens: int, completion_tokens: int) -> int:
    """What tokens of model cost, in picos, at its current prices."""
    return prompt_tokens * per_token(model.price_prompt) + completion_tokens * per_token(
        model.price_completion
    )
