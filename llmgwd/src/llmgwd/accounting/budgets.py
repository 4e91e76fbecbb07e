"""Token and spend budgets per key and period (UTC day or month): used, plus reserved in flight."""

from __future__ import annotations

from dataclasses import dataclass

from llmgwd.accounting.periods import month_of, period_id
from llmgwd.accounting.pricing import to_pico
from llmgwd.catalog import KeyLimits, Period

TOKENS, PICOS, HELD = 0, 1, 2  # an entry's two counts, and a reservation's requests in flight


@dataclass(frozen=True, slots=True)
class Exhausted:
    """Why a request does not fit a key's budget."""

    what: str  # "tokens" or "spend"
    period: Period
    limit: int  # tokens, or picos
    used: int  # settled plus reserved
    requested: int
    # Not spent but set aside by requests in flight (another control plane's share of the
    # budget among them): worth trying again after this many seconds. None: spent.
    retry_after_s: float | None = None


class Budgets:
    """What each key used this day and this month, and what its requests in flight reserved.

    Every key is counted, budget or not, so a budget set in the middle of a day starts from
    what was used already. check and take are separate so the caller can check every limit
    before taking from any; with no await between them they are one step.
    """

    def __init__(self) -> None:
        self._used: dict[tuple[str, str], list[int]] = {}  # (key id, period id): counts
        self._reserved: dict[str, list[int]] = {}  # key id: counts and requests in flight
        self._day = ""

    def check(
        self, key_id: str, limits: KeyLimits, tokens: int, picos: int, day: str
    ) -> Exhausted | None:
        """The first budget a request reserving tokens and picos would break, or None."""
        if not (limits.budget_tokens or limits.budget_spend):
            return None
        reserved = self._reserved.get(key_id, (0, 0))
        for what, index, limit, period, need in (
            ("tokens", TOKENS, limits.budget_tokens, limits.budget_tokens_per, tokens),
            ("spend", PICOS, to_pico(limits.budget_spend), limits.budget_spend_per, picos),
        ):
            if limit:
                counts = self._used.get((key_id, period_id(period, day)))
                used = (counts[index] if counts else 0) + reserved[index]
                if used + need > limit:
                    return Exhausted(what, period, limit, used, need)
        return None

    def take(self, key_id: str, tokens: int, picos: int) -> None:
        """Reserve a request's most tokens and picos."""
        held = self._reserved.get(key_id)
        if held is None:
            self._reserved[key_id] = [tokens, picos, 1]
        else:
            held[TOKENS] += tokens
            held[PICOS] += picos
            held[HELD] += 1

    def settle(
        self, key_id: str, reserved: tuple[int, int], tokens: int, picos: int, day: str
    ) -> None:
        """Release a reservation and count what the request used on day. The entry goes when
        its last request does (not when its counts reach zero: a request may reserve none)."""
        held = self._reserved[key_id]
        held[TOKENS] -= reserved[TOKENS]
        held[PICOS] -= reserved[PICOS]
        held[HELD] -= 1
        if not held[HELD]:
            del self._reserved[key_id]
        self.add(key_id, day, tokens, picos)

    def reserved(self, key_id: str) -> tuple[int, int]:
        """Tokens and picos set aside by the key's requests in flight."""
        held = self._reserved.get(key_id)
        return (held[TOKENS], held[PICOS]) if held else (0, 0)

    def add(self, key_id: str, day: str, tokens: int, picos: int) -> None:
        """Count usage of day (also how the usage stored before a restart comes back)."""
        if day > self._day:
            self._roll(day)
        for pid in (day, month_of(day)):
            counts = self._used.get((key_id, pid))
            if counts is None:
                self._used[(key_id, pid)] = [tokens, picos]
            else:
                counts[TOKENS] += tokens
                counts[PICOS] += picos

    def used(self, key_id: str, period: str) -> tuple[int, int]:
        """Tokens and picos settled in a period (a day or month id)."""
        counts = self._used.get((key_id, period))
        return (counts[TOKENS], counts[PICOS]) if counts else (0, 0)

    def _roll(self, day: str) -> None:
        """A new day: forget the periods that ended."""
        keep = (day, month_of(day))
        self._used = {k: v for k, v in self._used.items() if k[1] in keep}
        self._day = day
