"""--wait on serve, remove and drain: poll /api/v1 until the change is done, a line on stderr
each time what is seen changes; a replica failing or the time running out ends the command
with its own exit status."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import click

from llmgw.api_types import ModelView, NodeView, ReplicaView
from llmgw.cli.common import API, NotFound, Settings, api_path, call, decoded

F = TypeVar("F", bound=Callable[..., object])
S = TypeVar("S")

EXIT_TIMEOUT = 5  # --wait: the time ran out first
EXIT_FAILED = 6  # --wait: a replica failed (which and why on stderr)
DEFAULT_TIMEOUT_S = 600.0
POLL_S = 1.0
_DONE_STATES = ("ready", "stopped")


class TimedOut(click.ClickException):
    """--wait's time ran out before the change was done."""

    exit_code = EXIT_TIMEOUT


class ReplicaFailed(click.ClickException):
    """A replica the wait depends on failed."""

    exit_code = EXIT_FAILED


def wait_options(f: F) -> F:
    """--wait and --timeout."""
    f = click.option(
        "--timeout",
        "wait_timeout",
        type=click.FloatRange(min=0),
        default=DEFAULT_TIMEOUT_S,
        show_default=True,
        metavar="SECONDS",
        help=f"With --wait: seconds to wait at most (then exit status {EXIT_TIMEOUT}).",
    )(f)
    return click.option(
        "--wait",
        "wait_done",
        is_flag=True,
        help="Wait until it is done, a line on stderr as it goes; exit status "
        f"{EXIT_FAILED} if a replica fails, {EXIT_TIMEOUT} if --timeout runs out.",
    )(f)


@dataclass(frozen=True, slots=True)
class Seen:
    """One poll's reading: a line for people, whether it is done, and a failure ("": none)."""

    line: str
    done: bool
    failure: str = ""


def until(poll: Callable[[], Seen], timeout_s: float, what: str) -> None:
    """Poll until done, printing each new line; raise ReplicaFailed or TimedOut."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        seen = poll()
        if seen.line != last:
            click.echo(seen.line, err=True)
            last = seen.line
        if seen.failure:
            raise ReplicaFailed(seen.failure)
        if seen.done:
            return
        if time.monotonic() >= deadline:
            raise TimedOut(f"{what}: not done after {timeout_s:g} s ({seen.line})")
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


def _replica(r: ReplicaView) -> str:
    return f"{r.id} on {r.node} {r.state}"


def why(r: ReplicaView) -> str:
    """What a failed replica's node says of it: out of memory, or its message."""
    said = "out of memory (over its memory limit)" if r.reason == "oom" else ""
    return "; ".join(x for x in (said, r.message) if x) or "no reason given"


def failures(replicas: Iterable[ReplicaView]) -> str:
    """The failed replicas, which and why ("": none)."""
    failed = [r for r in replicas if r.state == "failed"]
    return "; ".join(f"replica {r.id} on {r.node} failed: {why(r)}" for r in failed)


def served(m: ModelView) -> Seen:
    """A model's replicas against those wanted: done when as many are ready as wanted and
    no other is starting or stopping."""
    reps = m.replica_status
    line = f"model {m.name}: {m.ready}/{m.replicas} ready"
    if reps:
        line += " (" + ", ".join(_replica(r) for r in reps) + ")"
    done = m.ready == m.replicas and all(r.state in _DONE_STATES for r in reps)
    return Seen(line, done, failures(reps))


def wait_served(settings: Settings, name: str, timeout_s: float) -> None:
    """Until model name has its wanted replicas ready (or none, when none is wanted)."""
    path = api_path("models", name)
    until(lambda: served(decoded(call(settings, "GET", path), ModelView)), timeout_s,
          f"model {name}")  # fmt: skip


def _nodes(settings: Settings) -> list[NodeView]:
    return decoded(call(settings, "GET", f"{API}/nodes"), list[NodeView])


def _of(nodes: list[NodeView], keep: Callable[[str, str], bool]) -> list[ReplicaView]:
    """The replicas the nodes report that keep(node, model) takes, not stopped."""
    return [ReplicaView(id=r.id, node=n.name, state=r.state, message=r.message, reason=r.reason)
            for n in nodes for r in n.replicas
            if keep(n.name, r.model) and r.state != "stopped"]  # fmt: skip


def gone(name: str, nodes: list[NodeView]) -> Seen:
    """A removed model's replicas: done when no node reports one still running."""
    left = _of(nodes, lambda _node, model: model == name)
    if not left:
        return Seen(f"model {name}: no replica left", True)
    return Seen(f"model {name}: {len(left)} replica(s) left (" +
                ", ".join(_replica(r) for r in left) + ")", False)  # fmt: skip


def wait_gone(settings: Settings, name: str, timeout_s: float) -> None:
    """Until no node runs a replica of model name."""
    until(lambda: gone(name, _nodes(settings)), timeout_s, f"model {name}")


def drained(name: str, nodes: list[NodeView]) -> Seen:
    """A draining node: done when it holds no replica; a replacement of one of its models
    failing elsewhere fails the wait."""
    node = next((n for n in nodes if n.name == name), None)
    if node is None:
        raise NotFound(f"node {name} is no longer listed")
    held = _of([node], lambda _node, _model: True)
    models = {r.model for r in node.replicas}
    elsewhere = _of(nodes, lambda n, model: n != name and model in models)
    if not held:
        return Seen(f"node {name}: no replica left", True)
    line = f"node {name}: {len(held)} replica(s) left (" + ", ".join(map(_replica, held)) + ")"
    return Seen(line, False, failures(held + elsewhere))


def wait_drained(settings: Settings, name: str, timeout_s: float) -> None:
    """Until node name holds no replica."""
    until(lambda: drained(name, _nodes(settings)), timeout_s, f"node {name}")
