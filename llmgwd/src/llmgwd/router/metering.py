"""The router's metering: a request is admitted against its key's limits and budgets (all
checked, then all reserved, in one synchronous step), and settled to what it used."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from aiohttp import web

from llmgwd import pricing
from llmgwd.budgets import Budgets, Exhausted
from llmgwd.catalog import ApiKey, Model
from llmgwd.limits import RateLimits, Refusal, State
from llmgwd.periods import Today, seconds_left
from llmgwd.router import errors
from llmgwd.router.token_bounds import Estimate
from llmgwd.router.usage_events import Tally
from llmgwd.shares import Refill, Shares
from llmgwd.usage import Usage

Clock = Callable[[], float]
HEADERS = web.RequestKey("llmgw_ratelimit_headers", dict[str, str])  # for the answer, success too
_NAMES = {  # the x-ratelimit-* header names of each limit, made once
    kind: tuple(f"x-ratelimit-{what}-{kind}" for what in ("limit", "remaining", "reset"))
    for kind in ("requests", "tokens")
}
_LABELS = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)"}
_NO_RETRY = {"x-should-retry": "false"}  # OpenAI's clients then do not retry on their own


class Reservation:
    """One admitted request: what it reserved, and its tally for the proxy to fill in."""

    __slots__ = ("_meter", "_settled", "estimate", "headers", "key", "model", "picos", "second",
                 "tally", "ticket")  # fmt: skip

    def __init__(
        self, meter: Meter, key: ApiKey, model: Model, estimate: Estimate, picos: int
    ) -> None:
        self._meter = meter
        self._settled = False
        self.key = key
        self.model = model
        self.estimate = estimate
        self.picos = picos  # the most the request may cost
        self.second: int | None = None  # when the rate window counted it (None: no limit)
        self.headers: dict[str, str] = {}
        self.tally = Tally()
        self.ticket: object = None  # what the cluster's shares reserved (None: no shares)

    def used(self) -> tuple[int, int]:
        """(prompt, completion) tokens to count: the engine's usage when it gave one."""
        tally, bound = self.tally, self.estimate
        if tally.usage is not None:
            return tally.usage
        if not tally.answered:
            return 0, 0
        # An answer without usage (a stream cut short): the prompt's bound, and about one
        # token per event relayed (engines stream a token an event).
        events = bound.completion if tally.events is None else tally.events
        return bound.prompt, min(events, bound.completion)

    def settle(self) -> None:
        """Replace the reservation by what was used (once; the handler's finally calls it)."""
        if not self._settled:
            self._settled = True
            self._meter.settle(self)


class Meter:
    """Rate limits, budgets and the usage counter, as the router applies them.

    With shares (several control planes over one store: llmgwd.allotments), a request must
    also fit this control plane's share of each of its key's limits and budgets.
    """

    def __init__(
        self,
        usage: Usage | None = None,
        *,
        shares: Shares | None = None,
        wall: Clock = time.time,
        monotonic: Clock = time.monotonic,
    ) -> None:
        self.usage = usage if usage is not None else Usage(None)
        self.shares = shares
        self.limits = RateLimits()
        self.budgets = Budgets()
        self._wall = wall
        self._monotonic = monotonic
        self._today = Today()
        # Told (model, prompt, completion, picos) of each settled request the engine answered.
        self.on_settled: Callable[[str, int, int, int], None] | None = None

    async def load(self) -> None:
        """Count this month's stored usage against the budgets (at start, before serving)."""
        month_start = self._today.at(self._wall())[:7] + "-01"
        for r in await self.usage.records(month_start):
            c = r.counts
            self.budgets.add(r.key_id, r.day, c.prompt_tokens + c.completion_tokens, c.spend_pico)

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

    def _admit(
        self, key: ApiKey, model: Model, estimate: Estimate, *, wait: bool
    ) -> Reservation | Refill:
        now, ts = self._monotonic(), self._wall()
        tokens, day = estimate.total, self._today.at(ts)
        picos = pricing.cost(model, estimate.prompt, estimate.completion)
        exhausted = self.budgets.check(key.id, key.limits, tokens, picos, day)
        if exhausted is not None:
            raise _quota_error(key, exhausted, ts)
        refusal = self.limits.check(key.id, key.limits, tokens, now, estimate.requests)
        if refusal is not None:
            raise _rate_error(key, refusal, self.limits.states(key.id, key.limits, now))
        shares, share = self.shares, (key.id, key.limits, tokens, picos, estimate.requests, day)
        if shares is not None:
            short = shares.check(*share, wait=wait)
            if isinstance(short, Refill):
                return short
            if isinstance(short, Exhausted):
                raise _quota_error(key, short, ts)
            if short is not None:
                raise _rate_error(key, short, self.limits.states(key.id, key.limits, now))
        reservation = Reservation(self, key, model, estimate, picos)
        reservation.second = self.limits.take(key.id, key.limits, tokens, now, estimate.requests)
        self.budgets.take(key.id, tokens, picos)
        if shares is not None:
            reservation.ticket = shares.take(*share)
        if reservation.second is not None:
            reservation.headers = rate_headers(self.limits.states(key.id, key.limits, now))
        return reservation

    def settle(self, r: Reservation) -> None:
        """Release r's reservations and count what it used (memory only)."""
        prompt, completion = r.used()
        tokens = prompt + completion
        picos = pricing.cost(r.model, prompt, completion)
        day = self._today.at(self._wall())
        if r.second is not None:
            self.limits.settle(r.key.id, r.second, r.estimate.total, tokens, self._monotonic())
        self.budgets.settle(r.key.id, (r.estimate.total, r.picos), tokens, picos, day)
        if self.shares is not None:
            self.shares.settle(r.ticket, tokens, picos)
        if r.tally.answered:
            self.usage.add((day, r.key.id, r.model.name), prompt, completion, picos)
            if self.on_settled is not None:
                self.on_settled(r.model.name, prompt, completion, picos)


def rate_headers(states: list[State]) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers for the limits a key has."""
    headers = {}
    for s in states:
        limit, remaining, reset = _NAMES[s.kind]
        headers[limit] = str(s.limit)
        headers[remaining] = str(s.remaining)
        headers[reset] = duration(s.reset_s)
    return headers


async def add_rate_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the admitted request's x-ratelimit-* headers on its answer."""
    headers = request.get(HEADERS)
    if headers:
        response.headers.update(headers)


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


def _rate_error(key: ApiKey, refusal: Refusal, states: list[State]) -> errors.ApiError:
    label = _LABELS[refusal.kind]
    headers = rate_headers(states)
    if refusal.retry_after_s is None:
        reduce = (
            "Send fewer prompts in one request (each counts as a request)."
            if refusal.kind == "requests"
            else "Reduce max_tokens or the prompt (a prompt counts as at most its size in bytes "
            "until the engine reports its tokens)."
        )
        message = (
            f"Request too large for {label} on key {key.id}: Limit {refusal.limit}, Requested "
            f"{refusal.requested}. {reduce}"
        )
        return errors.rate_limited(message, refusal.kind, {**headers, **_NO_RETRY})
    wait = refusal.retry_after_s
    message = (
        f"Rate limit reached for {label} on key {key.id}: Limit {refusal.limit}, Used "
        f"{refusal.used}, Requested {refusal.requested}. Please try again in {duration(wait)}."
    )
    headers["Retry-After"] = _retry_after(wait)
    return errors.rate_limited(message, refusal.kind, headers)


def _quota_error(key: ApiKey, exhausted: Exhausted, ts: float) -> errors.ApiError:
    e = exhausted
    if e.what == "tokens":
        spent = f"has used {e.used} of its {e.limit} tokens"
        more = f"may use up to {e.requested} more"
    else:
        spent = f"has spent {_money(e.used)} of its {_money(e.limit)}"
        more = f"may cost up to {_money(e.requested)} more"
    if e.retry_after_s is not None:  # e.used: as last reported, maybe long before
        budget = f"{e.limit} tokens" if e.what == "tokens" else _money(e.limit)
        message = (
            f"The budget of key {key.id} for this {e.period} (UTC), {budget}, is set aside for "
            f"requests in flight on this or other control planes, and this request {more}. "
            f"Please try again in {duration(e.retry_after_s)}."
        )
        return errors.quota_exceeded(message, {"Retry-After": _retry_after(e.retry_after_s)})
    message = (
        f"You exceeded your current quota: key {key.id} {spent} for this {e.period} (UTC), "
        f"and this request {more}. The budget renews at the start of the next {e.period}."
    )
    retry = _retry_after(seconds_left(e.period, ts))
    return errors.quota_exceeded(message, {"Retry-After": retry, **_NO_RETRY})


def _money(picos: int) -> str:
    return f"{pricing.from_pico(picos):.6f}".rstrip("0").rstrip(".")
