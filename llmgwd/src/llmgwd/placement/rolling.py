"""Rolling replacement: a model's replicas moved to its new settings one at a time. No I/O.

A replica is stale when what it was started with (Placement.started: the model's restart
generation, the context wanted, the profile's engine flags and KV cache type) differs from
the model's now (`llmgw model restart`, `llmgw model context`). The reconciler asks step()
each pass, per profile, what to do next:
- a stale replica its node reports not ready (starting, failed) serves nothing: it is
  started again with the new settings at once; one not heard from (its node silent, or not
  reported since llmgwd started) may be serving: the roll waits for word of it;
- else, while every replica of the new settings is ready and no replacement is being placed,
  one stale replica is replaced: a new one is started beside it where placement has room
  (surge 1: the ready count never drops), else the stale one is stopped and its replacement
  placed in its room (at most one unavailable: a model with one replica is down until it is
  ready); a profile with fewer placed than it wants (no room for all) rolls those it has;
- one profile of a model at a time, so the model too has at most one replica down;
- the stale one beside a new one stops once the new one is ready; the next one then;
- a replica of the new settings that fails to start (or is not ready in the reconciler's
  ROLL_READY_TIMEOUT_S: stuck starting) halts the roll: it is removed, the old
  replicas stay (a replica placed while halted runs the old settings: so does one placed for
  an old one stopped for it), and the model's state says so until its settings change again;
  the roll is not done while a replacement for a stopped one is not ready.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import msgspec

from llmgw import engine_args
from llmgwd.catalog import Model, profiles_of
from llmgwd.placement.profiles import Profile
from llmgwd.placement.scheduler import Placement, Started

Action = Literal["done", "wait", "restart", "surge", "retire", "halt"]


class Rollout(msgspec.Struct, frozen=True):
    """A model's roll to new settings (kept in the store while it runs or is halted)."""

    target: dict[str, Started]  # by profile: the settings rolled to
    old: dict[str, Started] = {}  # by profile: what its replicas ran before
    halted: str = ""  # why it stopped ("" while it goes on)
    # by profile: its count when an old replica was stopped for a replacement (no room
    # beside), so a new leader too waits for that replacement, or halts if it fails
    stopped: dict[str, int] = {}


class Step(NamedTuple):
    """What to do next for one profile: the action, and the replicas it is about."""

    action: Action
    replicas: tuple[Placement, ...] = ()
    outgoing: Placement | None = None  # a stale replica its surge replacement stands beside


def settings(model: Model, profile: Profile) -> Started:
    """The settings a replica of model's profile is started with now."""
    return Started(
        generation=model.generation,
        context=profile.context or model.context,
        args=list(profile.args),
        cache_type=profile.cache_type,
    )


def targets(model: Model) -> dict[str, Started]:
    """The settings of each of model's profiles now, by profile."""
    return {p.name: settings(model, p) for p in profiles_of(model)}


def needs_place(old: Started, new: Started) -> bool:
    """Whether a replica moving from old to new settings needs placing anew (its memory
    differs with the context, the KV cache type or the slots its engine flags name), not
    only starting again in place."""
    return (old.context, old.cache_type, _slots(old.args)) != (
        new.context,
        new.cache_type,
        _slots(new.args),
    )


def _slots(args: list[str]) -> list[int]:
    """The slots args name for each engine (the placement counts them: scheduler._Need)."""
    return [engine_args.slots_named(engine, args) for engine in engine_args.SLOTS_OPTION]


def step(
    want: int,
    mine: list[Placement],
    now: Started,
    state: Callable[[str], str],
    failing: Callable[[str], bool],
    placing: bool = False,
    replacing: bool = False,
) -> Step:
    """The next step of one profile's roll (the module's docstring says which). mine: the
    profile's placements; state: a replica's state by id ("" where its node has not
    reported it: then it waits, never restarts it); failing: whether one failed to start
    (as the reconciler counts failures); placing: a stale one was stopped for a
    replacement not placed yet; replacing: that replacement is placed, not ready yet (the
    roll is not done until it is: should it fail, the old settings come back)."""
    stale = sorted((p for p in mine if p.started != now), key=lambda p: p.id)
    fresh = [p for p in mine if p.started == now]
    if not (stale or replacing) or want <= 0:
        return Step("done")
    bad = [p for p in fresh if failing(p.id)]
    if bad:
        return Step("halt", (bad[0],))
    if not stale:
        return Step("wait")  # the last replacement, not ready yet
    idle = tuple(p for p in stale if state(p.id) not in ("", "ready"))
    if idle:
        return Step("restart", idle)
    unheard = any(not state(p.id) for p in stale)  # its node silent or not reported yet
    waiting = unheard or any(state(p.id) != "ready" for p in fresh)
    if len(mine) == want + 1:
        return Step("wait" if waiting else "retire", (stale[0],), outgoing=stale[0])
    if len(mine) > want or waiting or placing:
        return Step("wait")
    return Step("surge", (stale[0],))


def note(stale: int, want: int, room: bool) -> str:
    """A running roll as people read it: how many replicas are left, and how (room: a new
    replica fits beside the old ones)."""
    if room:
        how = "each new one started beside an old one, which stops once it is ready"
    elif want <= 1:
        how = "it restarts in place: one replica and no room for a second, so the model is"
        how += " down until it is ready again"
    else:
        how = "no room for one more: each old one stops before its replacement starts"
    many = "replica" if stale == 1 else "replicas"
    return f"replacing {stale} {many} for the new settings, one at a time ({how})"
