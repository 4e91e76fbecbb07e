"""One run of a long job for every replica waiting for it: a replica removed while it waits
leaves the job running for the others; a failed run is tried again by the next caller."""

from __future__ import annotations

import asyncio

import pytest

from llmgw_agentd import once


async def test_a_caller_that_goes_away_leaves_the_run_to_the_others() -> None:
    gate, runs = asyncio.Event(), []

    async def job(tell: once.Progress) -> str:
        runs.append(1)
        tell("building, 50%")
        await gate.wait()
        return "built"

    first: list[str] = []
    second: list[str] = []
    gone = asyncio.create_task(once.run("k", job, first.append))
    await asyncio.sleep(0)
    stays = asyncio.create_task(once.run("k", job, second.append))
    await asyncio.sleep(0.01)
    assert first == ["building, 50%"] and second == ["building, 50%"]  # told when it joined
    gone.cancel()  # its replica removed
    with pytest.raises(asyncio.CancelledError):
        await gone
    gate.set()
    assert await stays == "built" and runs == [1]
    assert first[-1] == second[-1] == ""  # each caller's message cleared


async def test_a_failed_run_is_every_callers_error_and_the_next_tries_again() -> None:
    tries: list[int] = []

    async def job(tell: once.Progress) -> int:
        tries.append(1)
        if len(tries) == 1:
            raise ValueError("no cuBLAS")
        return len(tries)

    got = await asyncio.gather(once.run("f", job, None), once.run("f", job, None),
                               return_exceptions=True)  # fmt: skip
    assert [str(e) for e in got] == ["no cuBLAS", "no cuBLAS"] and tries == [1]
    assert await once.run("f", job, None) == 2
