"""The systemd client against a fake systemd on a private bus: units, their ends, by signals."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw_agentd.systemd import Systemd, SystemdError, UnitState, unit_path
from tests.llmgw_agentd.fake_systemd import FakeSystemd, fake_systemd

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
NAME = "llmgw-engine-t1.service"


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[tuple[Systemd, FakeSystemd]]:
    async with fake_systemd(tmp_path) as (address, fake):
        sd = Systemd(address)
        await sd.connect()
        try:
            yield sd, fake
        finally:
            await sd.close()


async def test_a_started_unit_runs_its_argv(bus: tuple[Systemd, FakeSystemd]) -> None:
    sd, fake = bus
    assert fake.subscribed == 1
    result = await sd.start_transient(NAME, SLEEPER, [])
    assert result == "done"
    st = await sd.state(NAME)
    assert st.running and st.active_state == "active" and st.main_pid > 0
    os.kill(st.main_pid, 0)  # a real process
    units = await sd.list_units("llmgw-engine-*.service")
    assert [(u.name, u.active_state) for u in units] == [(NAME, "active")]
    assert await sd.list_units("other-*.service") == []


async def test_a_killed_unit_is_seen_by_its_signal(bus: tuple[Systemd, FakeSystemd]) -> None:
    sd, fake = bus
    seen: list[UnitState] = []
    ended = asyncio.Event()

    def on_change(st: UnitState) -> None:
        seen.append(st)
        if st.active_state == "failed":
            ended.set()

    sd.watch(NAME, on_change)
    await sd.start_transient(NAME, SLEEPER, [])
    fake.kill(NAME)
    await asyncio.wait_for(ended.wait(), 5)
    last = seen[-1]
    assert last.active_state == "failed" and last.result == "signal"
    assert last.describe() == "killed by signal SIGKILL"
    # As systemd 252 does: a new unit is signalled inactive once, before it activates.
    states = [s.active_state for s in seen]
    assert states.index("inactive") < states.index("active") < states.index("failed")


async def test_stop_waits_for_the_unit_to_be_gone(bus: tuple[Systemd, FakeSystemd]) -> None:
    sd, _ = bus
    await sd.start_transient(NAME, SLEEPER, [])
    pid = (await sd.state(NAME)).main_pid
    assert await sd.stop(NAME) == "done"
    assert (await sd.state(NAME)).removed
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert await sd.stop(NAME) == ""  # nothing left to stop


async def test_a_failed_unit_keeps_its_name_until_reset(bus: tuple[Systemd, FakeSystemd]) -> None:
    sd, _ = bus
    await sd.start_transient(NAME, [sys.executable, "-c", "raise SystemExit(3)"], [])
    for _ in range(100):
        st = await sd.state(NAME)
        if st.ended:
            break
        await asyncio.sleep(0.02)
    assert st.active_state == "failed" and st.describe() == "exited with status 3"
    with pytest.raises(SystemdError) as e:
        await sd.start_transient(NAME, SLEEPER, [])
    assert e.value.name == "org.freedesktop.systemd1.UnitExists"
    await sd.reset_failed(NAME)
    assert await sd.start_transient(NAME, SLEEPER, []) == "done"
    await sd.reset_failed("never-loaded.service")  # no error


async def test_a_program_that_cannot_run_fails_its_start_job(
    bus: tuple[Systemd, FakeSystemd],
) -> None:
    sd, _ = bus
    assert await sd.start_transient(NAME, ["/nonexistent/engine"], []) == "failed"
    st = await sd.state(NAME)
    assert st.describe().startswith("could not start: 203/EXEC")


def test_unit_paths_are_escaped_as_systemd_does() -> None:
    assert unit_path("dbus.service") == "/org/freedesktop/systemd1/unit/dbus_2eservice"
    assert unit_path("llmgw-engine-r1.service").endswith("llmgw_2dengine_2dr1_2eservice")
    assert unit_path("1x.service").endswith("_31x_2eservice")


def test_how_a_unit_ended_in_words() -> None:
    assert UnitState("u", result="signal", exit_code=2, exit_status=9).describe() == (
        "killed by signal SIGKILL"
    )
    assert UnitState("u", result="exit-code", exit_code=1, exit_status=1).describe() == (
        "exited with status 1"
    )
    no_key = UnitState("u", result="exit-code", exit_code=1, exit_status=243)
    assert "CREDENTIALS" in no_key.describe()
    assert UnitState("u", result="timeout").describe() == "failed: timeout"


async def test_a_packaged_unit_is_started_restarted_and_the_manager_reloaded(
    bus: tuple[Systemd, FakeSystemd],
) -> None:
    sd, fake = bus
    await sd.reload()
    assert await sd.start("slurmd.service") == "done"
    assert await sd.restart("slurmd.service") == "done"
    assert fake.reloads == 1
    assert fake.file_jobs == [("StartUnit", "slurmd.service"), ("RestartUnit", "slurmd.service")]
