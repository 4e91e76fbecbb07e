"""Requests and tokens per minute per key: sliding windows of one-second buckets over 60 s."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmgwd.catalog import KeyLimits

SPAN_S = 60


class Window:
    """Counts of the last SPAN_S seconds, one bucket a second; what leaves the window is gone.

    Times are the caller's clock in seconds (monotonic); bucket b holds what was counted
    during second b and leaves the window at time b + SPAN_S.
    """

    __slots__ = ("_buckets", "_newest", "_total")

    def __init__(self) -> None:
        self._buckets = [0] * SPAN_S
        self._newest = 0  # the latest second seen
        self._total = 0

    def _advance(self, second: int) -> None:
        """Empty the buckets of the seconds that left the window since the latest one seen."""
        if second <= self._newest:
            return
        if second - self._newest >= SPAN_S:
            self._buckets = [0] * SPAN_S
            self._total = 0
        else:
            for s in range(self._newest + 1, second + 1):
                i = s % SPAN_S
                self._total -= self._buckets[i]
                self._buckets[i] = 0
        self._newest = second

    def used(self, now: float) -> int:
        """The sum over the window ending now."""
        if now >= self._newest + 1:  # a new second: the call only then (the request path)
            self._advance(int(now))
        return self._total

    def add(self, now: float, n: int) -> int:
        """Count n now; returns the second it was counted in."""
        second = int(now)
        if second > self._newest:
            self._advance(second)
        self._buckets[second % SPAN_S] += n
        self._total += n
        return second

    def take_back(self, second: int, now: float, n: int) -> None:
        """Uncount n counted during second, unless that second has left the window already."""
        if now >= self._newest + 1:
            self._advance(int(now))
        if second > self._newest - SPAN_S:
            self._buckets[second % SPAN_S] -= n
            self._total -= n

    def free_in(self, now: float, need: int, limit: int) -> float | None:
        """Seconds until need fits under limit as the window slides; None if it never will."""
        if need > limit:
            return None
        self._advance(int(now))
        over = self._total + need - limit
        if over <= 0:
            return 0.0
        for s in range(self._newest - SPAN_S + 1, self._newest + 1):
            over -= self._buckets[s % SPAN_S]
            if over <= 0:
                return max(0.0, s + SPAN_S - now)
        return None  # not reached: the buckets sum to the total

    def empty_in(self, now: float) -> float:
        """Seconds until everything counted now has left the window (OpenAI's "reset")."""
        self._advance(int(now))
        for s in range(self._newest, self._newest - SPAN_S, -1):
            if self._buckets[s % SPAN_S]:
                return max(0.0, s + SPAN_S - now)
        return 0.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request does not fit a key's rate limit now."""

    kind: str  # "requests" or "tokens", OpenAI's error type for each
    limit: int
    used: int  # in the window now, requests in flight included
    requested: int
    retry_after_s: float | None  # None: the request is larger than the limit itself


@dataclass(frozen=True, slots=True)
class State:
    """One limit as the x-ratelimit-* headers show it."""

    kind: str  # "requests" or "tokens"
    limit: int
    remaining: int
    reset_s: float  # until the window is empty


class RateLimits:
    """Each limited key's two windows: requests, and tokens (reserved, then settled).

    check and take are separate so the caller can check every limit and budget before
    taking from any; called one after the other with no await between, they are one step.
    """

    def __init__(self) -> None:
        self._windows: dict[str, tuple[Window, Window]] = {}

    def _of(self, key_id: str) -> tuple[Window, Window]:
        pair = self._windows.get(key_id)
        if pair is None:
            pair = self._windows[key_id] = (Window(), Window())
        return pair

    def check(
        self, key_id: str, limits: KeyLimits, tokens: int, now: float, requests: int = 1
    ) -> Refusal | None:
        """The first limit a request of tokens, counting as requests, would break, or None."""
        if not (limits.rpm or limits.tpm):
            return None
        reqs, toks = self._of(key_id)
        for kind, window, limit, need in (
            ("requests", reqs, limits.rpm, requests),
            ("tokens", toks, limits.tpm, tokens),
        ):
            if limit and window.used(now) + need > limit:
                wait = window.free_in(now, need, limit)
                return Refusal(kind, limit, window.used(now), need, wait)
        return None

    def take(
        self, key_id: str, limits: KeyLimits, tokens: int, now: float, requests: int = 1
    ) -> int | None:
        """Count the request (as requests) and reserve its tokens; returns the second to settle
        against."""
        if not (limits.rpm or limits.tpm):
            return None
        reqs, toks = self._of(key_id)
        reqs.add(now, requests)
        return toks.add(now, tokens)

    def settle(self, key_id: str, second: int, reserved: int, used: int, now: float) -> None:
        """Replace a reservation by what was used, counted now."""
        toks = self._of(key_id)[1]
        toks.take_back(second, now, reserved)
        if used:
            toks.add(now, used)

    def states(self, key_id: str, limits: KeyLimits, now: float) -> list[State]:
        """The key's limits as they stand now, for the headers."""
        if not (limits.rpm or limits.tpm):
            return []
        out = []
        for kind, window, limit in zip(
            ("requests", "tokens"), self._of(key_id), (limits.rpm, limits.tpm), strict=True
        ):
            if limit:
                used = window.used(now)
                out.append(State(kind, limit, max(0, limit - used), window.empty_in(now)))
        return out

    def strictest(self, levels: Iterable[tuple[str, KeyLimits]], now: float) -> list[State]:
        """Of each kind of limit, the state of the level with the least remaining (then the
        smallest limit): the limit that will refuse first, whichever level holds it. Only
        the chosen level's reset is worked out."""
        best: dict[str, tuple[int, int, Window]] = {}
        for ident, limits in levels:
            if not (limits.rpm or limits.tpm):
                continue
            reqs, toks = self._of(ident)
            for kind, window, limit in (
                ("requests", reqs, limits.rpm),
                ("tokens", toks, limits.tpm),
            ):
                if limit:
                    left = max(0, limit - window.used(now))
                    held = best.get(kind)
                    if held is None or (left, limit) < (held[0], held[1]):
                        best[kind] = (left, limit, window)
        return [State(kind, limit, left, window.empty_in(now))
                for kind, (left, limit, window) in best.items()]  # fmt: skip
