"""The router's metering: a request is admitted against the limits and budgets of its key and
of every level above it (all checked, then all reserved, in one synchronous step), and settled
to what it used."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import msgspec

from llmgwd.accounting import pricing
from llmgwd.accounting.budgets import Budgets, Exhausted
from llmgwd.accounting.levels import Chain, Levels
from llmgwd.accounting.periods import Today, seconds_left
from llmgwd.accounting.rates import RateLimits, Refusal, State
from llmgwd.accounting.shares import Refill, Shares
from llmgwd.accounting.usage import Usage
from llmgwd.catalog import ApiKey, KeyLimits, Model
from llmgwd.router import errors
from llmgwd.router.token_bounds import Estimate
from llmgwd.router.usage_events import Tally

Clock = Callable[[], float]
_NAMES = {  # the x-ratelimit-* header names of each limit, made once
    kind: tuple(f"x-ratelimit-{what}-{kind}" for what in ("limit", "remaining", "reset"))
    for kind in ("requests", "tokens")
}
_LABELS = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)"}
_NO_RETRY = {"x-should-retry": "false"}  # OpenAI's clients then do not retry on their own


Level = tuple[str, KeyLimits]  # a level's id (a key's own: the key's id) and its limits
_NO_CHAIN = Chain((), None)


class Reservation:
    """One admitted request: what it reserved at each level, and its tally for the proxy."""

    __slots__ = ("_meter", "_settled", "estimate", "headers", "key", "levels", "model", "picos",
                 "seconds", "tally", "tickets")  # fmt: skip

    def __init__(
        self,
        meter: Meter,
        key: ApiKey,
        model: Model,
        estimate: Estimate,
        picos: int,
        levels: tuple[Level, ...],
    ) -> None:
        self._meter = meter
        self._settled = False
        self.key = key
        self.model = model
        self.estimate = estimate
        self.picos = picos  # the most the request may cost
        self.levels = levels  # the key's own first, then its user, org, team, project
        self.seconds: list[int | None] = []  # when each level's rate window counted it
        self.headers: dict[str, str] = {}
        self.tally = Tally()
        self.tickets: list[object] = []  # what the cluster's shares reserved, a level each

    def used(self) -> tuple[int, int]:
        """(prompt, completion) tokens to count: the engine's usage of a whole answer; of a
        stream, at least one token per token-bearing event read from the engine, so that a
        stream cut before its final usage (message_start's output_tokens: 0) is charged
        what the engine made (engines stream a token an event, or fewer events)."""
        tally, bound = self.tally, self.estimate
        if not tally.answered:
            return (0, 0) if tally.usage is None else tally.usage
        if tally.events is None:  # a whole answer: its usage, else the most it could be
            return tally.usage if tally.usage is not None else (bound.prompt, bound.completion)
        prompt, told = tally.usage if tally.usage is not None else (bound.prompt, 0)
        if not tally.prompt_told:
            prompt = bound.prompt
        return prompt, max(told, min(tally.tokens, bound.completion))

    def settle(self) -> None:
        """Replace the reservation by what was used (once; the handler's finally calls it).
        While the engine's rest is still read after the client left, it waits for that."""
        if self._settled:
            return
        if self.tally.draining:
            self.tally.on_drained = self.settle
            return
        self._settled = True
        self._meter.settle(self)


class Meter:
    """Rate limits, budgets and the usage counter, as the router applies them, at every level
    of a key (its own, its user's, organization's, team's and project's: llmgwd.accounting.levels).

    With shares (several control planes over one store: accounting.allotments), a request must
    also fit this control plane's share of each level's limits and budgets.
    """

    def __init__(
        self,
        usage: Usage | None = None,
        *,
        shares: Shares | None = None,
        levels: Levels | None = None,
        wall: Clock = time.time,
        monotonic: Clock = time.monotonic,
    ) -> None:
        self.usage = usage if usage is not None else Usage(None)
        self.shares = shares
        self.levels = levels
        self.limits = RateLimits()
        self.budgets = Budgets()
        self._wall = wall
        self._monotonic = monotonic
        self._today = Today()
        # Told (model, prompt, completion, picos) of each settled request the engine answered.
        self.on_settled: Callable[[str, int, int, int], None] | None = None

    async def load(self) -> None:
        """Count this month's stored usage against the budgets of every level (at start,
        before serving)."""
        month_start = self._today.at(self._wall())[:7] + "-01"
        for r in await self.usage.records(month_start):
            c = r.counts
            tokens = c.prompt_tokens + c.completion_tokens
            self.budgets.add(r.key_id, r.day, tokens, c.spend_pico)
            chain = self.levels.of_key_id(r.key_id) if self.levels is not None else _NO_CHAIN
            for ident, _ in chain.levels:
                self.budgets.add(ident, r.day, tokens, c.spend_pico)

    def admit(self, key: ApiKey, model: Model, estimate: Estimate) -> Reservation:
        """Reserve the request's most tokens and spend, or raise the 429 of the first limit or
        budget it would break. No await in here: checks and reservations are one step."""
        admitted = self._admit(key, model, estimate, wait=False)
        assert isinstance(admitted, Reservation)
        return admitted

    async def reserve(self, key: ApiKey, model: Model, estimate: Estimate) -> Reservation:
        """admit, waiting (at most the shares' wait_s) while a short share is refilled."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.shares.wait_s if self.shares is not None else 0.0)
        while isinstance(
            admitted := self._admit(key, model, estimate, wait=loop.time() < deadline), Refill
        ):  # others on this control plane may take the refill first: wait for the next one
            await admitted.wait(deadline - loop.time())
        return admitted

    def allows(self, key: ApiKey, model: str) -> bool:
        """Whether every level above key lets it use model (/v1/models lists no other)."""
        chain = self.levels.chain(key) if self.levels is not None else _NO_CHAIN
        return chain.models is None or model in chain.models

    def levels_of(self, key: ApiKey, model: Model) -> tuple[Level, ...]:
        """The levels a request of key for model is held to, its key's first; a model another
        level does not allow is a 404 as if it did not exist (nothing shown of it)."""
        chain = self.levels.chain(key) if self.levels is not None else _NO_CHAIN
        if chain.models is not None and model.name not in chain.models:
            raise errors.model_not_found(model.name)
        levels: tuple[Level, ...] = ((key.id, key.limits), *chain.levels)
        if model.price_prompt or model.price_completion:
            return levels
        # A model with no price costs nothing: no spend budget ever holds it back.
        return tuple((i, _unpriced(lim)) for i, lim in levels)

    def _admit(
        self, key: ApiKey, model: Model, estimate: Estimate, *, wait: bool
    ) -> Reservation | Refill:
        now, ts = self._monotonic(), self._wall()
        tokens, day, requests = estimate.total, self._today.at(ts), estimate.requests
        picos = pricing.cost(model, estimate.prompt, estimate.completion)
        levels = self.levels_of(key, model)
        if not estimate.billed:  # counting a prompt: held to the rates only, costs nothing
            levels, picos = tuple((i, _unbudgeted(lim)) for i, lim in levels), 0
        for ident, limits in levels:  # every level checked before any is taken from
            exhausted = self.budgets.check(ident, limits, tokens, picos, day)
            if exhausted is not None:
                raise _quota_error(ident, exhausted, ts)
            refusal = self.limits.check(ident, limits, tokens, now, requests)
            if refusal is not None:
                raise _rate_error(ident, refusal, self.limits.states(ident, limits, now))
        if self.shares is not None:
            short = self._short(levels, tokens, picos, requests, day, wait)
            if short is not None:
                return short
        reservation = Reservation(self, key, model, estimate, picos, levels)
        for ident, limits in levels:
            reservation.seconds.append(self.limits.take(ident, limits, tokens, now, requests))
            self.budgets.take(ident, tokens if estimate.billed else 0, picos)
            if self.shares is not None:
                share = (ident, limits, tokens, picos, requests, day)
                reservation.tickets.append(self.shares.take(*share))
        if reservation.seconds.count(None) < len(reservation.seconds):  # a level has a rate
            # the headers show, of each kind, the limit that will refuse first at any level
            reservation.headers = rate_headers(self.limits.strictest(levels, now))
        return reservation

    def _short(
        self,
        levels: tuple[Level, ...],
        tokens: int,
        picos: int,
        requests: int,
        day: str,
        wait: bool,
    ) -> Refill | None:
        """A Refill to wait for when a level's share is short, or raise its 429; None: fits."""
        assert self.shares is not None
        for ident, limits in levels:
            short = self.shares.check(ident, limits, tokens, picos, requests, day, wait=wait)
            if isinstance(short, Refill):
                return short
            if isinstance(short, Exhausted):
                raise _quota_error(ident, short, self._wall())
            if short is not None:
                now = self._monotonic()
                raise _rate_error(ident, short, self.limits.states(ident, limits, now))
        return None

    def settle(self, r: Reservation) -> None:
        """Release r's reservations at every level and count what it used (memory only); a
        request that is not billed (a count of tokens) counts its tokens against the rates
        only, and is one request of no tokens in the usage and budgets."""
        prompt, completion = r.used()
        tokens = prompt + completion
        day = self._today.at(self._wall())
        now, reserved = self._monotonic(), (r.estimate.total, r.picos)
        if not r.estimate.billed:
            reserved, prompt, completion = (0, 0), 0, 0
        billed = prompt + completion
        picos = pricing.cost(r.model, prompt, completion)
        for (ident, _), second in zip(r.levels, r.seconds, strict=True):
            if second is not None:
                self.limits.settle(ident, second, r.estimate.total, tokens, now)
            self.budgets.settle(ident, reserved, billed, picos, day)
        if self.shares is not None:
            for ticket in r.tickets:
                self.shares.settle(ticket, tokens, picos)
        if r.tally.answered:
            self.usage.add((day, r.key.id, r.model.name), prompt, completion, picos)
            if self.on_settled is not None:
                self.on_settled(r.model.name, prompt, completion, picos)


def _unbudgeted(limits: KeyLimits) -> KeyLimits:
    """limits without their token and spend budgets (for a request that is not billed)."""
    if not (limits.budget_tokens or limits.budget_spend):
        return limits
    return msgspec.structs.replace(limits, budget_tokens=0, budget_spend=0.0)


def _unpriced(limits: KeyLimits) -> KeyLimits:
    """limits without their spend budget (for a model with no price)."""
    if not limits.budget_spend:
        return limits
    return msgspec.structs.replace(limits, budget_spend=0.0)


def level_label(ident: str) -> str:
    """A level's id as the error messages name it: "key ID", "organization acme", ..."""
    kind, _, rest = ident.partition(":")
    if not rest:
        return f"key {ident}"
    return f"{_KINDS.get(kind, kind)} {rest.replace(':', '/')}"


_KINDS = {"org": "organization", "team": "team", "project": "project", "user": "user"}


def rate_headers(states: list[State]) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers for the limits a key has."""
    headers = {}
    for s in states:
        limit, remaining, reset = _NAMES[s.kind]
        headers[limit] = str(s.limit)
        headers[remaining] = str(s.remaining)
        headers[reset] = duration(s.reset_s)
    return headers


def duration(seconds: float) -> str:
    """Seconds as OpenAI (Go) writes a duration: "20ms", "1.5s", "6m0s"."""
    ms = max(0, math.ceil(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    minutes, ms = divmod(ms, 60_000)
    text = f"{ms / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{minutes}m{text}" if minutes else text


def _retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


def _rate_error(ident: str, refusal: Refusal, states: list[State]) -> errors.ApiError:
    label, who = _LABELS[refusal.kind], level_label(ident)
    headers = rate_headers(states)
    if refusal.retry_after_s is None:
        reduce = (
            "Send fewer prompts in one request (each counts as a request)."
            if refusal.kind == "requests"
            else "Reduce max_tokens or the prompt (a prompt counts as at most its size in bytes "
            "until the engine reports its tokens)."
        )
        message = (
            f"Request too large for {label} on {who}: Limit {refusal.limit}, Requested "
            f"{refusal.requested}. {reduce}"
        )
        return errors.rate_limited(message, refusal.kind, {**headers, **_NO_RETRY})
    wait = refusal.retry_after_s
    message = (
        f"Rate limit reached for {label} on {who}: Limit {refusal.limit}, Used "
        f"{refusal.used}, Requested {refusal.requested}. Please try again in {duration(wait)}."
    )
    headers["Retry-After"] = _retry_after(wait)
    return errors.rate_limited(message, refusal.kind, headers)


def _quota_error(ident: str, exhausted: Exhausted, ts: float) -> errors.ApiError:
    e, who = exhausted, level_label(ident)
    if e.what == "tokens":
        spent = f"has used {e.used} of its {e.limit} tokens"
        more = f"may use up to {e.requested} more"
    else:
        spent = f"has spent {_money(e.used)} of its {_money(e.limit)}"
        more = f"may cost up to {_money(e.requested)} more"
    if e.retry_after_s is not None:  # e.used: as last reported, maybe long before
        budget = f"{e.limit} tokens" if e.what == "tokens" else _money(e.limit)
        message = (
            f"The budget of {who} for this {e.period} (UTC), {budget}, is set aside for "
            f"requests in flight on this or other control planes, and this request {more}. "
            f"Please try again in {duration(e.retry_after_s)}."
        )
        return errors.quota_exceeded(message, {"Retry-After": _retry_after(e.retry_after_s)})
    message = (
        f"You exceeded your current quota: {who} {spent} for this {e.period} (UTC), "
        f"and this request {more}. The budget renews at the start of the next {e.period}."
    )
    retry = _retry_after(seconds_left(e.period, ts))
    return errors.quota_exceeded(message, {"Retry-After": retry, **_NO_RETRY})


def _money(picos: int) -> str:
    return f"{pricing.from_pico(picos):.6f}".rstrip("0").rstrip(".")
