"""llmgwd's run(): a start or stop that raises has systemd drop the client port's sockets
(a crash loop then refuses clients rather than queueing them); a stop asked for keeps them
(a restart's gap is queued for the next llmgwd)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.config import ServerConfig
from llmgwd import daemon

DROP = "FDSTOREREMOVE=1\nFDNAME=client-port"


class Fake:
    """A daemon whose start or stop raises when told."""

    def __init__(self, fail_start: bool = False, fail_stop: bool = False) -> None:
        self.fail_start, self.fail_stop = fail_start, fail_stop

    async def start(self) -> None:
        if self.fail_start:
            raise RuntimeError("the store cannot be opened")

    async def stop(self) -> None:
        if self.fail_stop:
            raise RuntimeError("the usage could not be written")

    def reload(self) -> None:
        pass


@pytest.fixture
def notify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    yield sock
    sock.close()


def said(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


async def run_until_terminated(fake: Fake) -> None:
    task = asyncio.create_task(daemon.run(ServerConfig(), lambda _: fake))  # type: ignore[arg-type,return-value]  # a fake daemon
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)  # run()'s handler sets its stop
    await asyncio.wait_for(task, 5)


async def test_a_start_that_raises_drops_the_sockets(notify: socket.socket) -> None:
    with pytest.raises(RuntimeError):
        await daemon.run(ServerConfig(), lambda _: Fake(fail_start=True))  # type: ignore[arg-type,return-value]  # a fake daemon
    assert DROP in said(notify)


async def test_a_stop_asked_for_keeps_them_even_if_it_raises(notify: socket.socket) -> None:
    await run_until_terminated(Fake())
    assert DROP not in said(notify)
    with pytest.raises(RuntimeError):
        await run_until_terminated(Fake(fail_stop=True))
    assert DROP not in said(notify)  # asked to stop: the restart that follows may be fine
