"""systemd 252's file descriptor store as llmgwd uses it (llmgw/fdstore.py), in a real systemd:
what restart, crash, stop, a reload lowering FileDescriptorStoreMax, and FDSTOREREMOVE do to
the client port's socket it holds."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from integration.harness import REPO, PrivateSystemd

PORT = 17985  # apart from the other integration tests' ports
UNIT = "fdtest.service"
DIR = "/run/fdtest"  # the script's state and its mode, as the test sets them
SCRIPT = "/usr/local/lib/fdtest/serve.py"
DOWNGRADE = f"/etc/systemd/system/{UNIT}.d/downgrade.conf"

# One run of the unit: the client port's socket, as llmgwd gets it (mode "store") or as
# llmgw 0.1.0's llmgwd did, binding the port itself (mode "plain"); what it got is written
# to DIR/state before READY=1, then every connection is answered "PID LINE".
SERVE = """\
import json, os, signal, socket, sys
from llmgw import fdstore, sdnotify

PORT, DIR = int(sys.argv[1]), sys.argv[2]


def write(state):
    with open(DIR + "/state.tmp", "w") as f:
        json.dump(state, f)
    os.replace(DIR + "/state.tmp", DIR + "/state")


def bind(mode):
    if mode == "store":
        [sock] = fdstore.listeners("client-port", "127.0.0.1", PORT, 16)
        sock.setblocking(True)
        return sock
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", PORT))
    sock.listen(16)
    return sock


mode = open(DIR + "/mode").read().strip()
state = {"pid": os.getpid(), "mode": mode, "passed": fdstore.passed(os.environ, os.getpid()),
         "inode": None, "error": None, "forgot": False}
try:
    sock = bind(mode)
except OSError as e:
    state["error"] = f"{e.errno} {e.strerror}"
    write(state)
    sys.exit(1)
state["inode"] = os.fstat(sock.fileno()).st_ino


def forget(*_):
    fdstore.forget("client-port")
    state["forgot"] = True
    write(state)


signal.signal(signal.SIGUSR1, forget)
write(state)
sdnotify.notify("READY=1")
while True:
    conn, _ = sock.accept()
    with conn:
        line = conn.makefile().readline()
        conn.sendall(f"{os.getpid()} {line}".encode())
"""

SERVICE = f"""\
[Unit]
Description=fd store probe (integration/test_fdstore_systemd.py)
StartLimitIntervalSec=0

[Service]
Type=notify
NotifyAccess=main
ExecStartPre=/bin/sh -c 'sleep "$(cat {DIR}/pre-sleep)"'
ExecStart={REPO}/.venv/bin/python {SCRIPT} {PORT} {DIR}
FileDescriptorStoreMax=8
Restart=on-failure
RestartSec=1
TimeoutStartSec=20
TimeoutStopSec=5
"""


def show(ps: PrivateSystemd) -> dict[str, str]:
    """The unit's state, its main pid and how many descriptors systemd holds for it."""
    props = "ActiveState,SubState,MainPID,NFileDescriptorStore,FileDescriptorStoreMax"
    out = ps.systemctl("show", "-p", props, UNIT).stdout
    pairs = (line.partition("=") for line in out.splitlines())
    return {key: value for key, _, value in pairs}


def state(ps: PrivateSystemd) -> dict[str, Any]:
    """What the unit's last run wrote: pid, mode, passed (LISTEN_FDS by name), inode, error."""
    got: dict[str, Any] = json.loads(ps.read_file(f"{DIR}/state"))
    return got


def next_run(ps: PrivateSystemd, old_pid: int, timeout: float = 15.0) -> dict[str, Any]:
    """The state of the first run after old_pid's, once it has bound (or failed to)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = state(ps)
        if got["pid"] != old_pid:
            return got
        time.sleep(0.1)
    raise AssertionError(f"no new run after {old_pid}\n{ps.journal(UNIT, 30)}")


def wait_for(ps: PrivateSystemd, substates: set[str], timeout: float = 10.0) -> dict[str, str]:
    """The unit's state once its SubState is one of substates."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = show(ps)
        if now["SubState"] in substates:
            return now
        time.sleep(0.05)
    raise AssertionError(f"{UNIT} never {substates}: {show(ps)}\n{ps.journal(UNIT, 30)}")


def settle(ps: PrivateSystemd, mode: str = "store", pre_sleep: float = 0) -> dict[str, Any]:
    """Run mode, the gap before a start pre_sleep seconds; restarted, active: its state."""
    ps.write_file(f"{DIR}/mode", mode + "\n")
    ps.write_file(f"{DIR}/pre-sleep", f"{pre_sleep}\n")
    old = state(ps)["pid"]
    ps.systemctl("restart", UNIT)
    ps.wait_active(UNIT)
    return next_run(ps, old)


def ask(line: str) -> str:
    """Send line to the port and read the answer ("PID LINE")."""
    with socket.create_connection(("127.0.0.1", PORT), timeout=10) as c:
        c.sendall(line.encode() + b"\n")
        return c.makefile().readline().strip()


@pytest.fixture(scope="module")
def ps(systemd: PrivateSystemd) -> Iterator[PrivateSystemd]:
    """The probe unit, started, systemd holding its socket."""
    systemd.write_file(SCRIPT, SERVE)
    systemd.write_file(f"/etc/systemd/system/{UNIT}", SERVICE)
    systemd.write_file(f"{DIR}/mode", "store\n")
    systemd.write_file(f"{DIR}/pre-sleep", "0\n")
    systemd.systemctl("daemon-reload")
    systemd.systemctl("start", UNIT)
    systemd.wait_active(UNIT)
    yield systemd
    systemd.systemctl("stop", UNIT, check=False)


def test_a_restart_keeps_the_socket_and_a_connect_in_the_gap_waits(ps: PrivateSystemd) -> None:
    before = settle(ps, pre_sleep=2)
    assert show(ps)["NFileDescriptorStore"] == "1"
    ps.systemctl("restart", "--no-block", UNIT)
    gap = wait_for(ps, {"start-pre"})
    assert gap["MainPID"] == "0"  # no process of the unit holds the socket: systemd alone
    with socket.create_connection(("127.0.0.1", PORT), timeout=10) as c:
        c.sendall(b"in the gap\n")
        assert show(ps)["SubState"] == "start-pre"  # connected before the new run began
        answer = c.makefile().readline().strip()
    after = state(ps)
    assert after["pid"] != before["pid"]
    assert answer == f"{after['pid']} in the gap"
    assert after["inode"] == before["inode"]
    assert after["passed"] == {"client-port": [3]}


def test_a_crash_restarted_on_failure_keeps_the_socket(ps: PrivateSystemd) -> None:
    before = settle(ps, pre_sleep=1)
    ps.systemctl("kill", "-s", "KILL", UNIT)
    gap = wait_for(ps, {"auto-restart", "start-pre"})
    assert gap["MainPID"] == "0"
    with socket.create_connection(("127.0.0.1", PORT), timeout=10) as c:
        c.sendall(b"after a crash\n")
        assert show(ps)["SubState"] in {"auto-restart", "start-pre"}
        answer = c.makefile().readline().strip()
    after = state(ps)
    assert after["pid"] != before["pid"]
    assert answer == f"{after['pid']} after a crash"
    assert after["inode"] == before["inode"]
    assert after["passed"] == {"client-port": [3]}


def test_a_stop_releases_the_socket(ps: PrivateSystemd) -> None:
    before = settle(ps)
    ps.systemctl("stop", UNIT)
    assert show(ps)["NFileDescriptorStore"] == "0"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", PORT), timeout=10).close()
    ps.systemctl("start", UNIT)
    after = state(ps)
    assert after["pid"] != before["pid"]
    assert after["passed"] == {}
    assert after["inode"] != before["inode"]
    assert ask("started") == f"{after['pid']} started"


def test_a_reload_to_store_max_0_drops_the_socket(ps: PrivateSystemd) -> None:
    """What a downgrade to a package whose unit lacks FileDescriptorStoreMax= does; llmgw
    0.1.0's llmgwd binds the port itself ("plain"), and would fail on a socket still held."""
    settle(ps)
    before = settle(ps)  # a restart: the socket is the one systemd held
    assert before["passed"] == {"client-port": [3]}
    assert show(ps)["NFileDescriptorStore"] == "1"
    try:
        ps.write_file(DOWNGRADE, "[Service]\nFileDescriptorStoreMax=0\n")
        ps.systemctl("daemon-reload")
        reloaded = show(ps)
        ps.write_file(f"{DIR}/mode", "plain\n")
        ps.systemctl("restart", "--no-block", UNIT)
        after = next_run(ps, before["pid"])
        facts = {
            "max after reload": reloaded["FileDescriptorStoreMax"],
            "held after reload": reloaded["NFileDescriptorStore"],
            "passed to the downgraded run": after["passed"],
            "its bind failed": after["error"],
            "same socket": after["inode"] == before["inode"],
        }
        assert facts == {
            "max after reload": "0",
            "held after reload": "0",
            "passed to the downgraded run": {},
            "its bind failed": None,
            "same socket": False,
        }, f"systemd kept the store across a reload to FileDescriptorStoreMax=0: {facts}"
        ps.wait_active(UNIT)
        assert ask("downgraded") == f"{after['pid']} downgraded"
    finally:
        ps.run(["rm", "-f", DOWNGRADE])
        ps.systemctl("daemon-reload")


def test_fdstoreremove_then_restart_gives_a_new_socket(ps: PrivateSystemd) -> None:
    settle(ps)
    before = settle(ps)
    assert before["passed"] == {"client-port": [3]}
    ps.systemctl("kill", "-s", "USR1", "--kill-who=main", UNIT)
    deadline = time.monotonic() + 10
    while not state(ps)["forgot"]:
        assert time.monotonic() < deadline, "the run never sent FDSTOREREMOVE=1"
        time.sleep(0.05)
    while show(ps)["NFileDescriptorStore"] != "0":  # systemd reads the datagram meanwhile
        assert time.monotonic() < deadline, f"systemd still holds the socket: {show(ps)}"
        time.sleep(0.05)
    ps.systemctl("restart", UNIT)
    after = state(ps)
    assert after["pid"] != before["pid"]
    assert after["passed"] == {}
    assert after["inode"] != before["inode"]
    assert show(ps)["NFileDescriptorStore"] == "1"  # the new socket given to systemd again
