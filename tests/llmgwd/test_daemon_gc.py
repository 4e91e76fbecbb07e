"""llmgwd once started: what start-up built is frozen out of CPython's collections."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw import entry
from llmgw.config import ClientPort, ClusterPort, ServerConfig
from llmgwd import daemon as daemon_module
from llmgwd.daemon import Daemon


@pytest.fixture
def config(tmp_path: Path) -> ServerConfig:
    return ServerConfig(
        state_dir=str(tmp_path / "state"),
        socket=str(tmp_path / "llmgwd.sock"),
        client=ClientPort(listen="127.0.0.1:0"),
        cluster=ClusterPort(listen="127.0.0.1:0", advertise="https://127.0.0.1:17710"),
    )


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector as the tests had it, back after the test (the daemon freezes)."""
    threshold = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def walked(obj: object) -> bool:
    """Whether obj is in a generation that collections walk (a frozen one is in none)."""
    return any(o is obj for o in gc.get_objects())


async def test_a_started_llmgwd_freezes_what_it_built_and_still_stops(
    config: ServerConfig, collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Daemon] = []

    def record(cfg: ServerConfig) -> Daemon:
        made.append(Daemon(cfg))
        return made[-1]

    running = asyncio.create_task(daemon_module.run(config, record))
    try:
        for _ in range(500):
            if gc.get_freeze_count() or running.done():
                break
            await asyncio.sleep(0.02)
        assert gc.get_freeze_count() > 0, "llmgwd started without freezing its objects"
        catalog = made[0].catalog
        assert gc.is_tracked(catalog) and not walked(catalog)
        assert gc.get_threshold() == entry.GC_THRESHOLD
        after: list[object] = []
        assert walked(after)  # what comes after start is collected as ever
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # run's own handler: a clean stop, as systemd's
        await asyncio.wait_for(running, 10)
