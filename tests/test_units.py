"""The packaged systemd units as systemd reads them: the agent's watchdog is on, and what
pings it (llmgw.sdnotify.watchdog) pings at half of WATCHDOG_USEC only while the event loop
runs, so a stuck agent is restarted."""

from __future__ import annotations

import asyncio
import configparser
import itertools
import os
import socket
import time
from pathlib import Path

import pytest

from llmgw import entry, sdnotify

UNITS = Path(__file__).resolve().parent.parent / "units"


def service(name: str) -> dict[str, str]:
    """A unit's [Service] section (the last value of a key, as systemd takes it)."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    unit.read_string((UNITS / name).read_text())
    return dict(unit["Service"])


@pytest.mark.parametrize("name", ["llmgwd.service", "llmgw-agentd.service"])
def test_both_daemons_units_have_a_watchdog(name: str) -> None:
    unit = service(name)
    assert (unit["Type"], unit["NotifyAccess"], unit["WatchdogSec"]) == ("notify", "main", "30")


@pytest.mark.parametrize("name", ["llmgwd.service", "llmgw-agentd.service"])
def test_a_daemon_exiting_78_is_not_restarted(name: str) -> None:
    """78 (llmgw.entry.EX_CONFIG, both daemons' run_daemon): a config file it cannot use or
    (llmgwd) a store of a newer schema; a restart fails the same way, so Restart=on-failure
    must not loop on it."""
    unit = service(name)
    assert unit["Restart"] == "on-failure"
    assert str(entry.EX_CONFIG) in unit["RestartPreventExitStatus"].split()


async def test_the_watchdog_is_pinged_at_half_its_time_and_not_while_the_loop_is_stuck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "notify")
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind(path)
    systemd.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")  # WatchdogSec=1: a ping every 0.5 s
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    pings: list[float] = []

    async def systemd_hears() -> None:
        while True:
            assert await asyncio.get_running_loop().sock_recv(systemd, 64) == b"WATCHDOG=1"
            pings.append(time.monotonic())

    hearing = asyncio.create_task(systemd_hears())
    task = asyncio.create_task(sdnotify.watchdog())
    await asyncio.sleep(1.2)
    assert len(pings) >= 2  # at 0, 0.5 and 1 s; at half of WatchdogSec, not at all of it
    assert all(0.45 < b - a < 0.8 for a, b in itertools.pairwise(pings))
    stuck, before = time.monotonic(), len(pings)
    time.sleep(1.5)  # noqa: ASYNC251 (the loop stuck, as a blocking call would hold it)
    await asyncio.sleep(0.05)  # the loop runs again: the late ping goes out at once
    task.cancel()
    hearing.cancel()
    await task
    systemd.close()
    assert len(pings) == before + 1 and pings[-1] - stuck > 1.5  # none while it was stuck
