"""The client port's sockets in systemd's store: given with FDSTORE=1 under their name, taken
back from LISTEN_FDS after a restart when still what the settings bind, else replaced."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw import fdstore


class Systemd:
    """The notify socket's far end: what llmgwd sent it, descriptors included."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)

    def messages(self) -> list[tuple[str, list[socket.socket]]]:
        out: list[tuple[str, list[socket.socket]]] = []
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 4096, 8)
            except BlockingIOError:
                return out
            out.append((data.decode(), [socket.socket(fileno=fd) for fd in fds]))


@pytest.fixture
def systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Systemd]:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    s = Systemd(tmp_path / "notify")
    yield s
    s.sock.close()


def test_the_names_systemd_passed_are_read_for_this_process_only() -> None:
    env = {"LISTEN_PID": "42", "LISTEN_FDS": "3", "LISTEN_FDNAMES": "client-port:client-port:"}
    assert fdstore.passed(env, 42) == {"client-port": [3, 4], "unknown": [5]}
    assert fdstore.passed(env, 43) == {}  # another process's (a child must not take them)
    assert fdstore.passed({**env, "LISTEN_FDS": "x"}, 42) == {}


def test_new_sockets_are_given_to_systemd_under_their_name(systemd: Systemd) -> None:
    [sock] = fdstore.listeners("client-port", "127.0.0.1", 0, 16)
    try:
        [(text, [held])] = systemd.messages()
        assert text == "FDSTORE=1\nFDNAME=client-port"
        # systemd holds the very socket: a connection to it is queued even with ours closed
        port = sock.getsockname()[1]
        assert held.getsockname() == ("127.0.0.1", port)
        sock.close()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            conn, _ = held.accept()
            conn.close()
        held.close()
    finally:
        sock.close()


def test_kept_sockets_still_right_are_served_again(
    systemd: Systemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = socket.create_server(("127.0.0.1", 0))
    port = old.getsockname()[1]
    monkeypatch.setattr(fdstore, "take", lambda name: [os.dup(old.fileno())] if name else [])
    [sock] = fdstore.listeners("client-port", "127.0.0.1", port, 16)
    try:
        assert sock.getsockname() == ("127.0.0.1", port)
        assert systemd.messages() == []  # systemd holds them already
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            conn, _ = old.accept()  # one socket: the queue is the kept one's
            conn.close()
    finally:
        sock.close()
        old.close()


def test_kept_sockets_of_another_port_are_dropped_and_replaced(
    systemd: Systemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = socket.create_server(("127.0.0.1", 0))
    dup = os.dup(old.fileno())
    monkeypatch.setattr(fdstore, "take", lambda name: [dup])
    [sock] = fdstore.listeners("client-port", "127.0.0.1", 0, 16)  # the settings moved it
    try:
        assert sock.getsockname()[1] != old.getsockname()[1]
        [(removed, []), (stored, [held])] = systemd.messages()
        assert removed == "FDSTOREREMOVE=1\nFDNAME=client-port"
        assert stored == "FDSTORE=1\nFDNAME=client-port"
        assert held.getsockname() == sock.getsockname()
        held.close()
    finally:
        sock.close()
        old.close()


def test_without_systemd_the_port_is_bound_and_nothing_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    socks = fdstore.listeners("client-port", "127.0.0.1", 0, 16)
    assert [s.getsockname()[0] for s in socks] == ["127.0.0.1"]
    for s in socks:
        s.close()


def test_a_new_host_on_the_same_port_waits_for_systemd_to_drop_the_old_socket(
    systemd: Systemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """client.listen moved from 0.0.0.0:P to 127.0.0.1:P: systemd still holds the old
    socket until it has read FDSTOREREMOVE (here: 0.3 s later), and the bind waits for it."""
    held = socket.create_server(("0.0.0.0", 0))  # systemd's copy
    port = held.getsockname()[1]
    monkeypatch.setattr(fdstore, "take", lambda name: [os.dup(held.fileno())])

    def carry_out() -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if any("FDSTOREREMOVE=1" in text for text, _ in systemd.messages()):
                time.sleep(0.3)
                held.close()
                return
            time.sleep(0.01)

    worker = threading.Thread(target=carry_out)
    worker.start()
    try:
        [sock] = fdstore.listeners("client-port", "127.0.0.1", port, 16)
    finally:
        worker.join()
        held.close()
    try:
        assert sock.getsockname() == ("127.0.0.1", port)
    finally:
        sock.close()


def test_what_systemd_passed_is_taken_once_and_other_names_are_closed_and_dropped(
    systemd: Systemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, other = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    monkeypatch.setattr(fdstore, "LISTEN_FDS_START", 700)  # fds 3, 4 are this test run's
    monkeypatch.setattr(fdstore, "_taken", False)
    os.dup2(mine.fileno(), 700)
    os.dup2(other.fileno(), 701)
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "2",
           "LISTEN_FDNAMES": "client-port:old-name"}  # fmt: skip
    try:
        assert fdstore.take("client-port", env) == [700]
        assert env == {}  # no child sees them
        with pytest.raises(OSError):
            os.fstat(701)  # the other name's closed here...
        assert [text for text, _ in systemd.messages()] == [
            "FDSTOREREMOVE=1\nFDNAME=old-name"  # ...and dropped from systemd's store
        ]
        assert fdstore.take("client-port", {}) == []  # once
    finally:
        os.close(700)
        mine.close()
        other.close()
