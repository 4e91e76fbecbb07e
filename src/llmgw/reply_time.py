"""How long a reply takes where one more replica of each profile would go, and whether it is
slow enough to be asked for on purpose: one rule for the console's serve form and `llmgw model
plan|serve` (--cpu-ok)."""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.api_types import PlanView, Verdict

REPLY_TOKENS = 1024  # a reply's length where the model sets no longest answer (max_tokens)
SLOW_S = 60.0  # a reply slower than this is served only when asked for on purpose


@dataclass(frozen=True, slots=True)
class Best:
    """Where one more replica of a profile would go: the place that fits with the longest
    context (None: none fits), and how long a reply takes there on CPUs (0.0: on cards)."""

    profile: str
    kind: str
    verdict: Verdict | None
    reply_tokens: int

    @property
    def reply_s(self) -> float:
        """Seconds a reply of reply_tokens takes at the place's tokens/s (0.0: not told)."""
        v = self.verdict
        return self.reply_tokens / v.tokens_per_s if v is not None and v.tokens_per_s else 0.0

    @property
    def slow(self) -> bool:
        """Whether a reply would take minutes."""
        return self.reply_s > SLOW_S

    def warning(self) -> str:
        """The sentence that says how slow, as the serve form and `llmgw model plan` say it."""
        v = self.verdict
        where = f"{v.node} ({v.tokens_per_s:.1f} tokens/s on its CPUs)" if v is not None else ""
        return (
            f"A reply of {self.reply_tokens} tokens would take about "
            f"{self.reply_s / 60:.1f} minutes on {where}"
        )


def best(plan: PlanView, max_tokens: int) -> list[Best]:
    """Per profile of plan, the place that fits with the longest context (the reduced
    placement's choice; at its full context every fitting place holds the same), of those
    the one with most slots."""
    out = []
    for p in plan.profiles:
        fits = [v for v in p.verdicts if v.fits]
        top = max(fits, key=lambda v: (v.context, v.slots), default=None)
        out.append(Best(p.name, p.kind, top, max_tokens or REPLY_TOKENS))
    return out


def slow(plan: PlanView, max_tokens: int) -> list[Best]:
    """The profiles of plan whose best place answers a reply in minutes."""
    return [b for b in best(plan, max_tokens) if b.slow]
