"""The balancer: least outstanding requests among ready replicas."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgwd.nodes.pool import Endpoint
from llmgwd.router import Balancer


@dataclass
class Pool:
    endpoints: list[Endpoint] = field(default_factory=list)

    def ready(self, model: str) -> list[Endpoint]:
        return [ep for ep in self.endpoints if ep.model == model]

    def wanted(self, model: str) -> int:
        return len(self.ready(model))


def ep(replica: str, model: str = "m") -> Endpoint:
    return Endpoint(replica_id=replica, model=model, node="n", url="http://x:1", api_key="k")


def test_picks_the_replica_with_fewest_requests_in_flight() -> None:
    a, b, c = ep("a"), ep("b"), ep("c")
    balancer = Balancer(Pool([a, b, c]))
    with balancer.hold(a), balancer.hold(a), balancer.hold(b):
        assert balancer.pick("m") == c
        with balancer.hold(c), balancer.hold(c):
            assert balancer.pick("m") == b


def test_equally_busy_replicas_take_turns() -> None:
    balancer = Balancer(Pool([ep("a"), ep("b")]))
    picked = {balancer.pick("m").replica_id for _ in range(4)}  # type: ignore[union-attr]
    assert picked == {"a", "b"}


def test_excluded_and_other_models_are_never_picked() -> None:
    balancer = Balancer(Pool([ep("a"), ep("b"), ep("x", model="other")]))
    assert balancer.pick("m", exclude={"a"}) == ep("b")
    assert balancer.pick("m", exclude={"a", "b"}) is None
    assert balancer.pick("none") is None


def test_counts_return_to_zero_even_when_the_request_fails() -> None:
    a = ep("a")
    balancer = Balancer(Pool([a]))
    try:
        with balancer.hold(a):
            assert balancer.outstanding("a") == 1
            raise RuntimeError("upstream broke")
    except RuntimeError:
        pass
    assert balancer.outstanding("a") == 0


def test_the_higher_priority_profile_is_filled_first() -> None:
    gpu = Endpoint("g", "m", "n", "http://x:1", "k", priority=10)
    cpu = Endpoint("c", "m", "n", "http://x:2", "k", priority=0)
    balancer = Balancer(Pool([cpu, gpu]), slots=2)
    assert balancer.pick("m") == gpu
    with balancer.hold(gpu):
        assert balancer.pick("m") == gpu  # a slot left: still the card
        with balancer.hold(gpu):
            assert balancer.pick("m") == cpu  # the card is full: the CPUs take the rest
