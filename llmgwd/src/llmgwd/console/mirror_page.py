"""The console's mirror page: its sets (sizes, sha256 state, fetch progress), peers, what a sweep
would free, and the mirror forms the person may send; read from GET /api/v1/mirror."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from llmgw.api_types import HeldSet, MirrorStatus, SetStatus, SweepIn, SweepOut
from llmgwd.console import forms, inproc
from llmgwd.console.base import Person, console, render
from llmgwd.console.pages import live, read_kept
from llmgwd.console.signin import required
from llmgwd.people.directory import Directory

HERE = "/console/mirror"
POLL_S = 5  # the live part's poll: sets' progress, the figures, the peers

# The mirror's forms: a sweep (what no model uses, deleted on the mirror and every node) and a
# peer to copy sets from. An import uploads a directory's files first (`llmgw mirror import`),
# and a set is fetched when a model names it (the models page): neither is a browser's form.
SWEEP = forms.Form("POST", "/mirror/sweep", "Sweep", danger=True)
PEER = forms.Form(
    "POST",
    "/mirror/peers",
    "Add peer",
    (
        forms.Field("body.url", "Peer's /hf address", "url"),
        forms.Field("body.token_file", "Token file on this host (optional)", "text"),
    ),
)
MIRROR_FORMS: tuple[forms.Form, ...] = (SWEEP, PEER)

# A set that failed because a file's bytes were not those its record names (size or checksum).
_BAD = re.compile(r"(?:sha256|git blob id) expected |expected \d+ bytes, got ")


@dataclass(frozen=True, slots=True)
class Checked:
    """A set's sha256 state: checked, checking, not yet, or bad; and its detail."""

    state: str
    detail: str

    @property
    def css(self) -> str:
        """Its class in the page."""
        return {"checked": "state-ready", "bad": "bad"}.get(self.state, "")


def checked(s: SetStatus) -> Checked:
    """Each file is checked (its size and sha256) before the mirror publishes it: a set done
    is checked whole; one that failed on a file's bytes is bad."""
    if s.state == "failed" and _BAD.search(s.error):
        return Checked("bad", s.error)
    if s.state == "done":
        return Checked("checked", f"all {s.files} files")
    if s.verifying:
        return Checked("checking", "a resumed file's bytes: " + ", ".join(s.verifying))
    return Checked("not yet", f"{s.files_done} of {s.files} files checked")


def size(n: float) -> str:
    """Bytes in words: 1.5 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # not reached


def eta(s: SetStatus) -> str:
    """What is left of a fetch, in words."""
    if s.state != "fetching":
        return ""
    if s.eta_s is None:
        return "time left not known yet"
    minutes, seconds = divmod(int(s.eta_s), 60)
    return f"{minutes} min {seconds} s left" if minutes else f"{seconds} s left"


def when(t: float) -> str:
    """A time in UTC, or never."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t > 0 else "never"


def held_by(s: SetStatus, held: list[HeldSet]) -> list[HeldSet]:
    """Among several control planes, the records of this set (by its repository and commit)."""
    return [h for h in held if f"{s.repo}@{s.commit}" in h.source]


async def _status(request: web.Request, person: Person) -> MirrorStatus | None:
    """GET /mirror as the person, or None where this llmgwd keeps no mirror (its 503)."""
    status: MirrorStatus | None = await read_kept(request, person, "/mirror")
    return status


async def preview(request: web.Request, person: Person) -> SweepOut | None:
    """What a sweep would free, from POST /mirror/sweep {dry_run: true} run as the person (it
    changes nothing); None where it answers no figures."""
    c = console(request)
    route = c.routes.of(SWEEP)
    body = msgspec.json.encode(SweepIn(dry_run=True))
    answer = await inproc.call(request, c.api, person.who, route, {}, body=body)
    return inproc.decoded(answer, route) if answer.ok else None


async def mirror_page(request: web.Request) -> web.Response:
    """GET /console/mirror: the mirror's figures, sets and peers (htmx polls them alone every
    POLL_S s), what a sweep would free, and the forms the person may send."""
    person = required(request)
    status = await _status(request, person)
    data: dict[str, Any] = {"status": status, "poll": POLL_S, "page": "mirror"}
    data |= {"checked": checked, "size": size, "eta": eta, "when": when, "held_by": held_by}
    if live(request):
        return render(request, "mirror_live.html", person, **data)
    c = console(request)
    drawn = []
    if status is not None:
        roles = Directory(c.keys.store)
        drawn = await forms.drawn(person.who, c.routes, MIRROR_FORMS, {}, roles)
    sweep = next((d for d in drawn if d.form is SWEEP), None)
    swept = await preview(request, person) if sweep is not None else None
    return render(request, "mirror.html", person, drawn=drawn, sweep=swept, back=HERE, **data)
