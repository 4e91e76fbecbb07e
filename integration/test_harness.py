"""The private systemd itself: units run, the journal works, nothing leaks to the host."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from integration.harness import (
    REPO,
    HarnessError,
    MakeLan,
    MakeSystemd,
    PrivateSystemd,
    _mountpoints_under,
    install_units,
)


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def test_transient_unit_is_active(systemd: PrivateSystemd) -> None:
    systemd.run(["systemd-run", "--unit=x", "--", "sleep", "60"])
    try:
        assert systemd.systemctl("is-active", "x.service").stdout.strip() == "active"
        # Its process is in the private pid namespace, seen from the host under another pid.
        main_pid = systemd.systemctl("show", "-P", "MainPID", "x.service").stdout.strip()
        assert int(main_pid) > 1
    finally:
        systemd.systemctl("stop", "x.service", check=False)


def test_journal_shows_unit_output(systemd: PrivateSystemd) -> None:
    marker = f"hello-from-the-journal-{uuid.uuid4().hex[:8]}"
    systemd.run(["systemd-run", "--unit=echo-marker", "--wait", "--", "echo", marker])
    _wait(lambda: marker in systemd.journal("echo-marker.service", 20), "the journal line")


def test_dbus_runs_and_nothing_failed(systemd: PrivateSystemd) -> None:
    assert systemd.systemctl("is-active", "dbus.service").stdout.strip() == "active"
    names = systemd.run(["busctl", "--no-pager", "list", "--acquired"]).stdout
    assert "org.freedesktop.systemd1" in names
    assert systemd.systemctl("--failed", "--no-legend", "--plain").stdout.strip() == ""
    assert systemd.run(["systemd-detect-virt", "--container"]).stdout.strip() == "container-other"


def test_credentials_reach_a_dynamic_user(systemd: PrivateSystemd) -> None:
    # How the agent hands an engine its key: SetCredential= and DynamicUser=yes.
    r = systemd.run(["systemd-run", "--quiet", "--wait", "--pipe", "-p", "DynamicUser=yes",
                     "-p", "SetCredential=key:s3cret", "--", "sh", "-c",
                     'cat "$CREDENTIALS_DIRECTORY/key"'])  # fmt: skip
    assert r.stdout == "s3cret"


def test_memory_max_reaches_the_cgroup(systemd: PrivateSystemd) -> None:
    systemd.run(["systemd-run", "--unit=capped", "-p", "MemoryMax=64M", "--", "sleep", "60"])
    try:
        cgroup = systemd.systemctl("show", "-P", "ControlGroup", "capped.service").stdout.strip()
        limit = systemd.run(
            "cat /sys/fs/cgroup/memory"
            + cgroup
            + "/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup"
            + cgroup
            + "/memory.max"
        ).stdout.strip()
        assert int(limit) == 64 * 1024 * 1024
    finally:
        systemd.systemctl("stop", "capped.service", check=False)


def test_host_tmp_and_cgroups_untouched(make_systemd: MakeSystemd, tmp_path: Path) -> None:
    # Its tmpfiles step would empty the host's /tmp if it shared it; and its cgroup setup
    # would remount the host's /sys/fs/cgroup read-only if it shared that tmpfs.
    marker = tmp_path / "still-here"
    marker.write_text("x")
    old = marker.stat().st_atime - 3 * 86400
    os.utime(marker, (old, old))
    # Compared with before, not with a clean host: another private systemd booted with the
    # bare recipe (sharing that tmpfs) may already have changed it.
    before = (sorted(os.listdir("/sys/fs/cgroup")), os.access("/sys/fs/cgroup", os.W_OK))
    ps = make_systemd("host")
    ps.run(["systemd-tmpfiles", "--clean"])
    assert ps.run(["test", "-e", str(marker)], check=False).returncode == 1
    assert marker.exists()
    ps.shutdown()
    after = (sorted(os.listdir("/sys/fs/cgroup")), os.access("/sys/fs/cgroup", os.W_OK))
    assert after == before


def test_write_file_lands_in_upper_only(systemd: PrivateSystemd) -> None:
    systemd.write_file("/etc/llmgw-harness-probe", "inside\n")
    assert systemd.read_file("/etc/llmgw-harness-probe") == "inside\n"
    assert (systemd.upper / "etc" / "llmgw-harness-probe").read_text() == "inside\n"
    assert not Path("/etc/llmgw-harness-probe").exists()


def test_shutdown_leaves_no_mount_behind() -> None:
    ps = PrivateSystemd(f"shutdown-{os.getpid()}")
    try:
        ps.boot()
        directory, cgroups = ps.directory, list(ps._cgroups)
        assert _mountpoints_under(directory), "the overlay should be mounted while it runs"
        ps.run(["systemd-run", "--unit=busy", "--", "sleep", "600"])
    finally:
        ps.shutdown()
    assert _mountpoints_under(directory) == {}
    assert not directory.exists()
    assert not any(c.exists() for c in cgroups)


def test_shutdown_after_a_crash_leaves_no_mount_behind() -> None:
    # As after a test that failed badly: systemd killed outright, then the fixture's cleanup.
    ps = PrivateSystemd(f"crash-{os.getpid()}")
    try:
        ps.boot()
        directory = ps.directory
        os.kill(ps.pid, signal.SIGKILL)
        _wait(lambda: not ps.alive(), "systemd to die")
        with pytest.raises(HarnessError):
            ps.run(["true"])
    finally:
        ps.shutdown()
    assert _mountpoints_under(directory) == {}
    assert not directory.exists()


def test_persistent_state_is_found_again() -> None:
    # What scripts/quickstart relies on: a second process finds the running one by its pid file.
    directory = Path(f"/var/lib/llmgw-test/persist-{os.getpid()}")
    ps = PrivateSystemd("persist", directory=directory, persistent=True)
    try:
        ps.boot()
        ps.write_file("/var/lib/kept", "1\n")
        again = PrivateSystemd.attach(directory)
        assert again.alive() and again.pid == ps.pid
        assert int((directory / "pid").read_text()) == ps.pid
        again.shutdown(remove=False)
        assert not ps.alive()
        ps = PrivateSystemd("persist", directory=directory, persistent=True)
        ps.boot()
        assert ps.read_file("/var/lib/kept") == "1\n"
    finally:
        ps.shutdown(remove=True)
    assert not directory.exists()


def test_two_hosts_on_a_lan(make_systemd: MakeSystemd, make_lan: MakeLan) -> None:
    lan = make_lan("lan")
    a = make_systemd("a", net=True)
    b = make_systemd("b", net=True)
    addr_a = lan.attach(a, 2)
    lan.attach(b, 3)
    assert a.run(["hostname"]).stdout.strip() != b.run(["hostname"]).stdout.strip()
    a.run(["systemd-run", "--unit=web", "--", "python3", "-m", "http.server", "--bind",
           addr_a, "8080", "--directory", "/etc"])  # fmt: skip
    a.wait_active("web.service")
    url = f"http://{addr_a}:8080/hostname"
    fetch = ["python3", "-c", "import urllib.request as u;"
             f"print(u.urlopen('{url}', timeout=2).read().decode())"]  # fmt: skip
    _wait(lambda: b.run(fetch, check=False).returncode == 0, "b to reach a's web server")
    assert b.run(fetch).stdout.strip() == a.run(["hostname"]).stdout.strip()


def _install(systemd: PrivateSystemd) -> None:
    install_units(systemd, venv=REPO / ".venv")


def test_units_verify(systemd: PrivateSystemd) -> None:
    _install(systemd)
    # Package-shaped first: /usr/bin/llmgwd as a package would install it (here only).
    for exe in ("llmgwd", "llmgw-agentd"):
        systemd.run(["ln", "-sf", str(REPO / ".venv" / "bin" / exe), f"/usr/bin/{exe}"])
    units = ["llmgwd.service", "llmgw-agentd.service", "llmgw-engines.slice"]
    paths = [f"/etc/systemd/system/{u}" for u in units]
    # --man=no: the man pages come with the packages, not with a checkout.
    r = systemd.run(["systemd-analyze", "verify", "--man=no", *paths], check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "llmgw" not in r.stderr, r.stderr
    # The checkout's drop-ins keep them valid.
    r = systemd.run(["systemd-analyze", "verify", "--man=no", *units], check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    # sysusers and tmpfiles did their part.
    assert systemd.run(["id", "-gn", "llmgw"]).stdout.strip() == "llmgw"
    owner = systemd.run(["stat", "-c", "%U:%G %a", "/run/llmgw", "/etc/llmgw"]).stdout
    assert owner.split("\n")[:2] == ["llmgw:llmgw 755", "root:llmgw 750"]


# What each daemon must be able to do under its unit's hardening, checked with a stand-in
# (the real daemons are tested in their own integration tests): notify, watchdog, its
# socket in /run/llmgw, its state directory, its config, TCP; the agent: D-Bus to systemd
# (a transient unit in llmgw-engines.slice), netlink and CAP_NET_ADMIN.
STAND_IN = r"""
import os, socket, subprocess, sys, time
def notify(msg):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    addr = os.environ["NOTIFY_SOCKET"]
    s.sendto(msg.encode(), "\0" + addr[1:] if addr.startswith("@") else addr)
role = sys.argv[1]  # llmgwd or agentd: names the socket
report = []
sock = socket.socket(socket.AF_UNIX)
path = f"/run/llmgw/{role}.sock"
if os.path.exists(path):
    os.unlink(path)
sock.bind(path)
sock.listen()
state = os.environ["STATE_DIRECTORY"]
open(os.path.join(state, "ok"), "w").write("ok")
report.append("config=" + open("/etc/llmgw/probe.yaml").read().strip())
tcp = socket.socket()
tcp.bind(("127.0.0.1", 0))
tcp.listen()
if role == "llmgwd":
    os.chown(path, -1, os.getgid())
    report.append("user=" + str(os.getuid()))
else:
    caps = [l for l in open("/proc/self/status") if l.startswith("CapEff")][0]
    report.append("net_admin=" + str(bool(int(caps.split()[1], 16) & (1 << 12))))
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()
    subprocess.run(["systemd-run", "--unit=llmgw-engine-probe", "--slice=llmgw-engines.slice",
                    "--", "sleep", "60"], check=True)
    report.append("engine=started")
open(os.path.join(state, "report"), "w").write("\n".join(report) + "\n")
notify("READY=1")
while True:
    notify("WATCHDOG=1")
    time.sleep(5)
"""


def test_units_hardening_leaves_the_daemons_working(systemd: PrivateSystemd) -> None:
    _install(systemd)
    systemd.write_file("/usr/local/lib/llmgw-stand-in.py", STAND_IN)
    systemd.run("install -m 0640 -g llmgw /dev/null /etc/llmgw/probe.yaml && "
                "echo 'probe: 1' > /etc/llmgw/probe.yaml")  # fmt: skip
    for unit, role in (("llmgwd", "llmgwd"), ("llmgw-agentd", "agentd")):
        systemd.write_file(
            f"/etc/systemd/system/{unit}.service.d/zz-stand-in.conf",
            "[Service]\nExecStart=\n"
            f"ExecStart=/usr/bin/python3 /usr/local/lib/llmgw-stand-in.py {role}\n",
        )
    systemd.systemctl("daemon-reload")
    try:
        systemd.systemctl("start", "llmgwd.service", "llmgw-agentd.service")
        systemd.wait_active("llmgwd.service")
        systemd.wait_active("llmgw-agentd.service")
        d = systemd.read_file("/var/lib/llmgw/report")
        a = systemd.read_file("/var/lib/llmgw-agent/report")
        uid = systemd.run(["id", "-u", "llmgw"]).stdout.strip()
        assert d.splitlines() == ["config=probe: 1", f"user={uid}"], d
        assert a.splitlines() == ["config=probe: 1", "net_admin=True", "engine=started"], a
        assert systemd.systemctl("is-active", "llmgw-engine-probe.service").stdout.strip() == (
            "active"
        )
        slice_ = systemd.systemctl("show", "-P", "Slice", "llmgw-engine-probe.service")
        assert slice_.stdout.strip() == "llmgw-engines.slice"
        socks = systemd.run(["stat", "-c", "%n %U:%G", "/run/llmgw/llmgwd.sock",
                             "/run/llmgw/agentd.sock"]).stdout.splitlines()  # fmt: skip
        assert socks == ["/run/llmgw/llmgwd.sock llmgw:llmgw", "/run/llmgw/agentd.sock root:root"]
        # ConfigurationDirectory= left the mode tmpfiles.d gave /etc/llmgw alone.
        etc = systemd.run(["stat", "-c", "%U:%G %a", "/etc/llmgw"]).stdout.strip()
        assert etc == "root:llmgw 750"
        # Restarting llmgwd keeps the agent's socket (RuntimeDirectoryPreserve=yes).
        systemd.systemctl("restart", "llmgwd.service")
        systemd.wait_active("llmgwd.service")
        assert systemd.run(["test", "-S", "/run/llmgw/agentd.sock"], check=False).returncode == 0
        # The watchdog is on (the stand-in pings it; waiting 30 s to see it bite is not worth it).
        wd = systemd.systemctl("show", "-P", "WatchdogUSec", "llmgwd.service").stdout.strip()
        assert wd == "30s"
    finally:
        systemd.systemctl("stop", "llmgwd.service", "llmgw-agentd.service",
                          "llmgw-engine-probe.service", check=False)  # fmt: skip
        systemd.run(["rm", "-rf", "/etc/systemd/system/llmgwd.service.d/zz-stand-in.conf",
                     "/etc/systemd/system/llmgw-agentd.service.d/zz-stand-in.conf"])  # fmt: skip
        systemd.systemctl("daemon-reload")
