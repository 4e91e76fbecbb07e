"""Taking a failing replica out of the pool: after repeated failures, for a pause that doubles."""

from __future__ import annotations

from llmgwd.router.ejection import Ejections


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def fail(ejections: Ejections, times: int, replica: str = "r1") -> None:
    for _ in range(times):
        ejections.failed(replica)


def test_three_failures_in_a_row_take_a_replica_out_for_its_pause() -> None:
    clock = Clock()
    ejections = Ejections(failures=3, pause_s=10, clock=clock)
    fail(ejections, 2)
    assert not ejections.out("r1")
    fail(ejections, 1)
    assert ejections.out("r1") and not ejections.out("r2")
    clock.advance(9.9)
    assert ejections.out("r1")
    clock.advance(0.1)
    assert not ejections.out("r1")


def test_a_success_between_failures_forgets_them() -> None:
    ejections = Ejections(failures=3, clock=Clock())
    fail(ejections, 2)
    ejections.succeeded("r1")
    fail(ejections, 2)
    assert not ejections.out("r1")


def test_failing_again_on_return_doubles_the_pause_up_to_its_cap() -> None:
    clock = Clock()
    ejections = Ejections(failures=3, pause_s=10, max_pause_s=30, clock=clock)
    fail(ejections, 3)
    pauses = []
    for _ in range(4):
        start = clock.now
        while ejections.out("r1"):
            clock.advance(1)
        pauses.append(clock.now - start)
        fail(ejections, 1)  # its trial request fails: out again at once
    assert pauses == [10, 20, 30, 30]
    while ejections.out("r1"):
        clock.advance(1)
    ejections.succeeded("r1")  # back, and answering: it starts afresh
    fail(ejections, 2)
    assert not ejections.out("r1")
    fail(ejections, 1)
    clock.advance(10)
    assert not ejections.out("r1")  # the first pause again, not the cap


def test_failures_of_requests_sent_before_it_went_out_add_nothing() -> None:
    clock = Clock()
    ejections = Ejections(failures=3, pause_s=10, clock=clock)
    fail(ejections, 3 + 5)  # five more were in flight when it went out
    clock.advance(10)
    assert not ejections.out("r1")
