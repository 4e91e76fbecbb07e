"""The stored ledger of one allotment pot (a key's budget in a period, or one of its rates):
what was spent and the share each control plane holds, and the one step that changes it.

A pot is one store key, changed only by compare-and-set on its mod_revision. Invariant, kept
by step(): spent (plus, for a rate, what was reported in the last minute) plus every holder's
share never exceeds the limit the step was given, so what the cluster can admit never does;
a dead holder's share is never freed, only counted as spent (or, a rate's, as recent use).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

ALLOT = "/allot/"
LIVE = ALLOT + "live/"  # /allot/live/<holder>: put with the holder's lease, gone when it dies
BUDGET = ALLOT + "budget/"  # /allot/budget/<period id>/<key id>/<tokens|spend>
RATE = ALLOT + "rate/"  # /allot/rate/<key id>/<requests|tokens>
WINDOW_S = 60.0  # a rate's window: what was reported counts this long


class Ledger(msgspec.Struct, kw_only=True):
    """One pot as stored."""

    spent: int = 0  # a budget's use in its period, as reported by the holders
    recent: list[tuple[int, float]] = msgspec.field(default_factory=list)  # a rate's reported
    # use: (amount, wall time it leaves the window)
    shares: dict[str, int] = msgspec.field(default_factory=dict)  # holder: amount it may use


_dec = msgspec.json.Decoder(Ledger)
_enc = msgspec.json.Encoder()


def decode(value: bytes) -> Ledger:
    """A ledger from its stored bytes."""
    return _dec.decode(value)


def encode(ledger: Ledger) -> bytes:
    """A ledger's stored bytes."""
    return _enc.encode(ledger)


def budget_key(period: str, key_id: str, what: str) -> str:
    """The pot of a key's budget of tokens or spend in a period (a day or month id)."""
    return f"{BUDGET}{period}/{key_id}/{what}"


def rate_key(key_id: str, what: str) -> str:
    """The pot of a key's requests or tokens per minute."""
    return f"{RATE}{key_id}/{what}"


def live_key(holder: str) -> str:
    """The key that says a holder is alive (put with its lease)."""
    return f"{LIVE}{holder}"


@dataclass(frozen=True, slots=True)
class Move:
    """What one holder asks of a pot in a step."""

    holder: str
    consumed: int  # used from its share since its last step, now reported as spent
    reserved: int  # in flight on its share: kept whatever the pot has left
    want: int  # the share it would hold after the step (0: give everything back)
    least: int  # the share it needs now (a waiting request's), even past half of what is free
    limit: int
    rate: bool  # a rate's pot (reported use leaves after WINDOW_S) or a budget's
    now: float  # wall time


def used(ledger: Ledger, now: float) -> int:
    """What the pot counts now: spent, reported use still in the window, and every share."""
    return (
        ledger.spent
        + sum(n for n, until in ledger.recent if until > now)
        + sum(ledger.shares.values())
    )


def step(ledger: Ledger, move: Move, dead: set[str]) -> tuple[Ledger, int]:
    """The ledger after a holder reports its use and takes (or gives back) its share, with
    the shares of dead holders taken back; returns it and the holder's new share.

    A holder gets what it wants up to half of what is free (so a busy one never starves the
    others), or what it needs now if that is more and free; a refill never takes away what it
    holds unused (requests are admitted on it while the step is under way).

    A dead holder's budget share is counted as spent, whole: it may have admitted requests
    on all of it and never reported them (it died between steps), so giving it back could
    overspend the budget; what it left unused is lost to the period. Its rate share is
    counted as used for a window from now, for the same reason.
    """
    now = move.now
    shares = {h: n for h, n in ledger.shares.items() if h not in dead}
    recent = [(n, until) for n, until in ledger.recent if until > now]
    gone = [ledger.shares[h] for h in dead if ledger.shares.get(h)]
    if move.rate:
        recent += [(n, now + WINDOW_S) for n in gone]
    mine = max(0, shares.pop(move.holder, 0) - move.consumed)  # what it holds unused now
    spent = ledger.spent if move.rate else ledger.spent + sum(gone)
    if move.consumed:
        if move.rate:
            recent.append((move.consumed, now + WINDOW_S))
        else:
            spent += move.consumed
    out = Ledger(spent=spent, recent=recent, shares=shares)
    free = move.limit - used(out, now)
    cap = max(free // 2, min(move.least, free), mine)  # leave the others half of what is free
    new = max(min(move.want, cap), move.reserved, 0)
    if new:
        shares[move.holder] = new
    return out, new
