"""`llmgw model serve|remove --wait` and `llmgw node drain --wait` against the admin API, over
the socket and over HTTPS: a line on stderr each time what the nodes report changes, exit 0
when done, 6 naming a failed replica and why, 5 when --timeout runs out."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
from click.testing import Result

from bench.api.fuzz_app import NoScheduling
from llmgw import wire
from llmgw.cli import wait
from llmgwd.api.base import ApiContext, NodeInfo
from llmgwd.placement.reconciler import NodeFlags
from tests.llmgw import test_cli
from tests.llmgw.test_cli import Daemon, daemon  # noqa: F401 (daemon: a fixture)

R = wire.ReplicaStatus


def node(name: str, *replicas: R) -> NodeInfo:
    """A connected node reporting these replicas."""
    return NodeInfo(name=name, address="10.0.0.1", connected=True, last_seen=1.0, cores=4,
                    memory_bytes=8 << 30, replicas=list(replicas))  # fmt: skip


class Steps:
    """The nodes as reported at each GET the CLI makes: the next state each time, the last
    one kept."""

    def __init__(self, *states: list[NodeInfo]) -> None:
        self.states = list(states)

    def __call__(self) -> list[NodeInfo]:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


# The reconciler of bench/api/fuzz_app.py: the drain route's flags kept, nothing placed.
Scheduling = NoScheduling


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wait, "POLL_S", 0.01)


@pytest.fixture
def scheduling(monkeypatch: pytest.MonkeyPatch) -> Scheduling:
    """A Scheduling the API of the daemon fixture is made with (requested before it)."""
    made = Scheduling()
    monkeypatch.setattr(test_cli, "ApiContext", functools.partial(ApiContext, scheduling=made))
    return made


@pytest.fixture
def smol(daemon: Daemon) -> Iterator[Daemon]:  # noqa: F811
    """The daemon with model smol in its catalog."""
    assert daemon.cli("model", "add", "smol", "--from", "file:/m/smol.gguf").exit_code == 0
    yield daemon


def lines(r: Result) -> list[str]:
    return r.stderr.strip().splitlines()


def test_serve_waits_until_the_replicas_wanted_are_ready(smol: Daemon) -> None:
    smol.nodes.nodes = Steps(  # type: ignore[method-assign]  # the fake's states, in turn
        [],
        [],
        [node("n1", R("r1", "smol", "starting"))],
        [node("n1", R("r1", "smol", "ready"), R("r2", "smol", "starting"))],
        [node("n1", R("r1", "smol", "ready"), R("r2", "smol", "ready"))],
    )
    r = smol.cli("model", "serve", "smol", "--replicas", "2", "--wait")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "model smol: 2 replicas wanted, 0 ready"
    assert lines(r) == [
        "model smol: 0/2 ready",
        "model smol: 0/2 ready (r1 on n1 starting)",
        "model smol: 1/2 ready (r1 on n1 ready, r2 on n1 starting)",
        "model smol: 2/2 ready (r1 on n1 ready, r2 on n1 ready)",
    ]


def test_serve_fewer_waits_for_the_others_to_stop(smol: Daemon) -> None:
    two = [node("n1", R("r1", "smol", "ready"), R("r2", "smol", "ready"))]
    smol.nodes.nodes = Steps(  # type: ignore[method-assign]  # the fake's states, in turn
        two, two, [node("n1", R("r1", "smol", "ready"), R("r2", "smol", "stopping"))],
        [node("n1", R("r1", "smol", "ready"))],
    )  # fmt: skip
    r = smol.cli("model", "serve", "smol", "--replicas", "1", "--wait")
    assert r.exit_code == 0, r.output
    assert lines(r)[-2:] == [
        "model smol: 1/1 ready (r1 on n1 ready, r2 on n1 stopping)",
        "model smol: 1/1 ready (r1 on n1 ready)",
    ]


def test_a_replica_failing_ends_the_wait_saying_which_and_why(smol: Daemon) -> None:
    failed = R("r2", "smol", "failed", message="engine exited 1", reason="oom")
    smol.nodes.nodes = Steps(  # type: ignore[method-assign]  # the fake's states, in turn
        [], [], [node("n1", R("r1", "smol", "ready"), failed)]
    )
    r = smol.cli("model", "serve", "smol", "--replicas", "2", "--wait", "--json")
    assert r.exit_code == wait.EXIT_FAILED == 6, r.output
    assert r.stdout.startswith("{")  # the answer, as without --wait
    assert r.stderr.strip().endswith(
        "Error: replica r2 on n1 failed: out of memory (over its memory limit); engine exited 1"
    )


def test_the_wait_ends_with_its_own_status_when_the_time_runs_out(smol: Daemon) -> None:
    smol.nodes.nodes = Steps([node("n1", R("r1", "smol", "starting"))])  # type: ignore[method-assign]  # the fake's
    r = smol.cli("model", "serve", "smol", "--replicas", "1", "--wait", "--timeout", "0.2")
    assert r.exit_code == wait.EXIT_TIMEOUT == 5, r.output
    assert lines(r) == [
        "model smol: 0/1 ready (r1 on n1 starting)",
        "Error: model smol: not done after 0.2 s (model smol: 0/1 ready (r1 on n1 starting))",
    ]


def test_remove_waits_until_no_node_runs_the_model(smol: Daemon) -> None:
    smol.nodes.nodes = Steps(  # type: ignore[method-assign]  # the fake's states, in turn
        [node("n1", R("r1", "smol", "stopping"), R("q1", "qwen", "ready"))],
        [node("n1", R("r1", "smol", "stopped"), R("q1", "qwen", "ready"))],
    )
    r = smol.cli("model", "remove", "smol", "--wait")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "Removed model smol."
    assert lines(r) == ["model smol: 1 replica(s) left (r1 on n1 stopping)",
                        "model smol: no replica left"]  # fmt: skip


def test_drain_waits_until_the_node_holds_no_replica(
    scheduling: Scheduling,
    daemon: Daemon,  # noqa: F811
) -> None:
    daemon.nodes.nodes = Steps(  # type: ignore[method-assign]  # the fake's states, in turn
        [node("n1", R("r1", "smol", "ready")), node("n2")],  # the route's check that it exists
        [node("n1", R("r1", "smol", "ready")), node("n2", R("r2", "smol", "starting"))],
        [node("n1", R("r1", "smol", "stopping")), node("n2", R("r2", "smol", "ready"))],
        [node("n1"), node("n2", R("r2", "smol", "ready"))],
    )
    r = daemon.cli("node", "drain", "n1", "--wait")
    assert r.exit_code == 0, r.output
    assert scheduling.flags("n1") == NodeFlags(cordoned=True, draining=True)
    assert lines(r) == ["node n1: 1 replica(s) left (r1 on n1 ready)",
                        "node n1: 1 replica(s) left (r1 on n1 stopping)",
                        "node n1: no replica left"]  # fmt: skip


def test_drain_fails_when_a_replacement_fails_elsewhere(
    scheduling: Scheduling,
    daemon: Daemon,  # noqa: F811
) -> None:
    daemon.nodes.nodes = Steps(  # type: ignore[method-assign]  # the fake's states, in turn
        [node("n1", R("r1", "smol", "ready")), node("n2")],
        [node("n1", R("r1", "smol", "ready")),
         node("n2", R("r2", "smol", "failed", message="no CUDA device"))],
    )  # fmt: skip
    r = daemon.cli("node", "drain", "n1", "--wait", "--timeout", "5")
    assert r.exit_code == 6, r.output
    assert lines(r)[-1] == "Error: replica r2 on n2 failed: no CUDA device"
