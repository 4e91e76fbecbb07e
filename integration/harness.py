"""A real systemd as PID 1 of private namespaces on a copy-on-write overlay of /, for tests."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

TEST_BASE = Path("/var/lib/llmgw-test")
REPO = Path(__file__).resolve().parent.parent
# scripts/build-llama-server's cache of llama-server builds
CACHE = Path(os.environ.get("LLMGW_CACHE", Path.home() / ".cache" / "llmgw"))
SYSTEMD = "/lib/systemd/systemd"
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TARGET = "llmgw-container.target"

# Units that make no sense in a container sharing the host's kernel, or that would reach
# out of it: gettys on the host's console, udev re-triggering the host's devices, sysctl
# and module loading (global), clock setting, network managers (they would reconfigure the
# host's links when the container shares its network), fsck/remount of the host's disks,
# and timers that only slow a boot down. Masking a unit this Debian lacks is harmless.
DEFAULT_MASKS: tuple[str, ...] = (
    "getty.target",
    "getty@.service",
    "serial-getty@.service",
    "console-getty.service",
    "container-getty@.service",
    "systemd-udevd.service",
    "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket",
    "systemd-udev-trigger.service",
    "systemd-udev-settle.service",
    "systemd-hwdb-update.service",
    "systemd-tmpfiles-setup-dev.service",
    "kmod-static-nodes.service",
    "systemd-modules-load.service",
    "systemd-sysctl.service",
    "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount",
    "proc-sys-fs-binfmt_misc.mount",
    "systemd-remount-fs.service",
    "systemd-fsck-root.service",
    "systemd-fsck@.service",
    "systemd-pstore.service",
    "systemd-firstboot.service",
    "systemd-machine-id-commit.service",
    "systemd-timesyncd.service",
    "chrony.service",
    "ntp.service",
    "systemd-networkd.service",
    "systemd-networkd.socket",
    "systemd-networkd-wait-online.service",
    "systemd-resolved.service",
    "NetworkManager.service",
    "NetworkManager-wait-online.service",
    "networking.service",
    "ifupdown-pre.service",
    "apt-daily.timer",
    "apt-daily.service",
    "apt-daily-upgrade.timer",
    "apt-daily-upgrade.service",
    "unattended-upgrades.service",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "man-db.timer",
    "fstrim.timer",
    "logrotate.timer",
    "systemd-tmpfiles-clean.timer",
)

# The default target: basic.target (journald, D-Bus, sysusers, tmpfiles) and nothing the
# host happens to enable in multi-user.target (its database, its sshd, ifupdown).
TARGET_UNIT = """\
[Unit]
Description=llmgw private systemd (integration/harness.py)
Requires=basic.target
Wants=dbus.socket dbus.service systemd-journald.service
After=basic.target dbus.service
AllowIsolate=yes
"""

# Runs as PID 1 of the new pid namespace, in the new mount namespace, before systemd.
# $1: the base directory; then the cgroup mounts (fstype, options, name; name "." for a
# cgroup2 that is /sys/fs/cgroup itself) as triples until "--", then the bind mounts
# (source, target, ro|rw) as triples until "--", then the hostname.
INNER = r"""
set -eu
B=$1; R=$B/root; shift
mount -t overlay overlay -o "lowerdir=/,upperdir=$B/upper,workdir=$B/work" "$R"
mount -t proc proc "$R/proc"
# /proc/sys is the host's for everything but the network: read-only, as nspawn does.
mount --bind "$R/proc/sys" "$R/proc/sys"; mount -o remount,bind,ro "$R/proc/sys"
mount --rbind /sys "$R/sys"
# A private /sys/fs/cgroup: systemd remounts that tmpfs read-only, which on a shared
# superblock would be the host's; each hierarchy is mounted afresh inside our cgroup
# namespace, so this systemd sees its own subtree as the root.
if [ "$3" = . ]; then  # cgroup v2 only: it is /sys/fs/cgroup itself
  # the host's, brought by the rbind, first: mount(8) refuses a cgroup2 over a cgroup2
  umount -l "$R/sys/fs/cgroup"
  mount -t cgroup2 -o "$2" cgroup2 "$R/sys/fs/cgroup"; shift 3
else
  mount -t tmpfs -o mode=0755,nosuid,nodev,noexec tmpfs "$R/sys/fs/cgroup"
fi
while [ "$1" != -- ]; do
  mkdir -p "$R/sys/fs/cgroup/$3"; mount -t "$1" -o "$2" "$1" "$R/sys/fs/cgroup/$3"; shift 3
done; shift
mount -o remount,bind,ro "$R/sys"
mount --rbind /dev "$R/dev"
# The host's console and kernel log stay the host's: systemd writes to a file instead.
mount --bind "$B/console" "$R/dev/console"; mount --bind /dev/null "$R/dev/kmsg"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$R/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/tmp"
while [ "$1" != -- ]; do
  if [ -d "$1" ]; then mkdir -p "$R$2"; else mkdir -p "$(dirname "$R$2")"; touch "$R$2"; fi
  mount --rbind "$1" "$R$2"
  if [ "$3" = ro ]; then mount -o remount,bind,ro "$R$2"; fi
  shift 3
done; shift
hostname "$1"
# systemd brings LoadCredential= files back from a helper mount namespace, which needs
# shared propagation; in a container it does not make / shared itself (a booted host has).
mount --make-rshared "$R"
exec chroot "$R" env -i container=llmgw PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  /lib/systemd/systemd --system --show-status=no
"""


class HarnessError(RuntimeError):
    """The private systemd could not be booted, reached or cleaned up; says why."""


class CommandFailed(HarnessError):
    """A command inside the private systemd exited non-zero."""

    def __init__(self, cmd: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(
            f"{shlex.join(self.cmd)} exited {returncode}\n"
            f"--- stdout ---\n{_tail(stdout)}\n--- stderr ---\n{_tail(stderr)}"
        )


@dataclass(frozen=True)
class Bind:
    """A host path mounted at target (the same path by default) inside the private systemd."""

    source: Path
    target: Path | None = None
    readonly: bool = False

    @classmethod
    def parse(cls, spec: str) -> Bind:
        """SRC[:DST][:ro|:rw], as the command line gives it."""
        parts = spec.split(":")
        readonly = False
        if parts[-1] in ("ro", "rw"):
            readonly = parts.pop() == "ro"
        if not parts or len(parts) > 2 or not parts[0]:
            raise ValueError(f"bind {spec!r}: want SRC[:DST][:ro]")
        target = Path(parts[1]) if len(parts) == 2 else None
        return cls(Path(parts[0]), target, readonly)


def binds() -> list[Bind]:
    """What a private systemd running this checkout needs bound in: the checkout, its .venv
    running the daemons, read-only (through the overlay alone it would be hidden when it
    lies under /tmp, a tmpfs inside, and could show stale files), and the llama-server build
    cache, read-only (engines run the binary, nothing writes it)."""
    found = [Bind(REPO, readonly=True)]
    return [*found, Bind(CACHE, readonly=True)] if CACHE.is_dir() else found


@dataclass(frozen=True)
class _Hierarchy:
    """One of the host's cgroup mounts and this process's place in it."""

    fstype: str
    options: str
    mountpoint: Path
    path: str


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _safe(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name) or name.startswith("."):
        raise ValueError(f"name {name!r}: use letters, digits, '_', '-', '.' (64 at most)")
    return name


def _hostname(name: str) -> str:
    """A valid host name made from a harness name (test names carry underscores)."""
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63] or "llmgw"


def _cgroup_hierarchies() -> list[_Hierarchy]:
    """The host's cgroup hierarchies under /sys/fs/cgroup, with our cgroup in each."""
    subsystems = {
        line.split()[0]
        for line in Path("/proc/cgroups").read_text().splitlines()
        if not line.startswith("#")
    }
    mine: dict[frozenset[str], str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        num, controllers, path = line.split(":", 2)
        key = frozenset(["2"]) if num == "0" else frozenset(controllers.split(","))
        mine[key] = path
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        mountpoint = Path(left.split()[4])
        fstype, _source, options = right.split()[:3]
        top = Path("/sys/fs/cgroup")
        if fstype not in ("cgroup", "cgroup2") or top not in (mountpoint, mountpoint.parent):
            continue
        opts = [o for o in options.split(",") if o not in ("rw", "ro")]
        if fstype == "cgroup2":
            key = frozenset(["2"])
        else:
            key = frozenset(o for o in opts if o in subsystems or o.startswith("name="))
        if key in mine:
            found.append(_Hierarchy(fstype, ",".join(opts) or "defaults", mountpoint, mine[key]))
    return found


def host_has_systemd() -> bool:
    """Whether systemd is PID 1 here (then it owns the cgroup tree and delegates a scope)."""
    try:
        comm = Path("/proc/1/comm").read_text().strip()
    except OSError:
        return False
    return Path("/run/systemd/system").is_dir() and comm == "systemd"


def _mountpoints_under(path: Path) -> dict[int, list[str]]:
    """Mount points at or below path in any process's mount namespace, by pid."""
    prefix = str(path)
    seen: dict[int, list[str]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            text = (proc / "mountinfo").read_text()
        except OSError:
            continue
        hits = [
            m
            for m in (line.split()[4] for line in text.splitlines())
            if m == prefix or m.startswith(prefix + "/")
        ]
        if hits:
            seen[int(proc.name)] = hits
    return seen


def _alive(pid: int, root: Path) -> bool:
    """Whether pid is still the systemd chrooted into root (not a reused pid)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "systemd" and os.readlink(
            f"/proc/{pid}/root"
        ) == str(root)
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _drop_host_firewall() -> None:
    """An agent's nftables table outlives the agent on purpose (kept across its restarts);
    one booted on the host's own network left its table on the host: it goes with it."""
    with contextlib.suppress(OSError):
        drop = ["nft", "delete", "table", "inet", "llmgw"]
        subprocess.run(drop, capture_output=True, check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    return state != "Z"


def _wait_for(predicate_false: list[int], timeout: float) -> bool:
    """Wait until none of the pids is alive; whether that happened in time."""
    deadline = time.monotonic() + timeout
    while any(_pid_alive(p) for p in predicate_false):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


class PrivateSystemd:
    """systemd as PID 1 of a private pid+mount(+uts, ipc, cgroup, optionally net) namespace.

    Its root is an overlay of the host's / in DIR/root with the writes in DIR/upper, so
    nothing it does reaches the host's files but through the bind mounts given.
    """

    def __init__(
        self,
        name: str,
        *,
        directory: Path | None = None,
        binds: Sequence[Bind] = (),
        net: bool = False,
        hostname: str | None = None,
        masks: Sequence[str] = DEFAULT_MASKS,
        target: str = TARGET,
        persistent: bool = False,
        boot_timeout: float = 60.0,
    ) -> None:
        self.name = _safe(name)
        self.directory = (directory or TEST_BASE / self.name).absolute()
        self.binds = list(binds)
        self.net = net
        # A host of its own gets its own name; one sharing the host's network keeps it.
        self.hostname = hostname or (_hostname(self.name) if net else os.uname().nodename)
        self.masks = list(masks)
        self.target = target
        self.persistent = persistent
        self.boot_timeout = boot_timeout
        self._pid: int | None = None
        self._launcher: subprocess.Popen[bytes] | None = None
        self._launcher_pid: int | None = None
        self._cgroups: list[Path] = []

    # -- paths -----------------------------------------------------------------

    @property
    def root(self) -> Path:
        """Where the overlay is mounted (inside the private mount namespace only)."""
        return self.directory / "root"

    @property
    def upper(self) -> Path:
        """The overlay's upper layer: everything the private systemd has written."""
        return self.directory / "upper"

    @property
    def pid(self) -> int:
        """The private systemd's pid as the host sees it."""
        if self._pid is None:
            raise HarnessError(f"{self.name}: not booted")
        return self._pid

    def alive(self) -> bool:
        """Whether the private systemd is running."""
        return self._pid is not None and _alive(self._pid, self.root)

    # -- lifecycle -------------------------------------------------------------

    def __enter__(self) -> PrivateSystemd:
        try:
            self.boot()
        except BaseException:
            self.shutdown()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    @classmethod
    def attach(cls, directory: Path) -> PrivateSystemd:
        """The private systemd a previous process booted in directory (running or not)."""
        directory = directory.absolute()
        try:
            state = json.loads((directory / "state.json").read_text())
        except (OSError, ValueError) as e:
            raise HarnessError(f"{directory}: no private systemd state here ({e})") from None
        ps = cls(
            state["name"],
            directory=directory,
            net=state["net"],
            persistent=state["persistent"],
        )
        ps._pid = int(state["pid"])
        ps._launcher_pid = int(state["launcher"])
        ps._cgroups = [Path(p) for p in state["cgroups"]]
        return ps

    def boot(self) -> None:
        """Start systemd and wait until it reports running or degraded."""
        if self.alive():
            return
        self._prepare()
        self._spawn()
        self._wait_running()

    def _prepare(self) -> None:
        if len(self.directory.parts) < 3:
            raise HarnessError(f"{self.directory}: too close to / for a private systemd")
        if (self.directory / "state.json").exists():
            # A previous run died without cleaning up: clear it (its upper unless persistent).
            old = PrivateSystemd.attach(self.directory)
            if old.alive():
                raise HarnessError(f"{self.name}: already running as pid {old.pid}")
            old.shutdown(remove=not self.persistent)
        if not self.persistent and self.directory.exists():
            self._remove_directory()
        for d in (self.upper, self.directory / "work", self.root):
            d.mkdir(parents=True, exist_ok=True)
        (self.directory / "console").write_text("")
        self._write_upper_config()

    def _upper_dir(self, path: str) -> Path:
        """Make path's directory in the upper layer with the lower one's owner and mode.

        A directory made in the upper layer with other attributes would change them in
        the merged view (root-owned 0755 everywhere is right only by luck).
        """
        rel = Path(path.lstrip("/"))
        here = self.upper
        lower = Path("/")
        for part in rel.parts:
            here, lower = here / part, lower / part
            if not here.exists():
                here.mkdir()
                with contextlib.suppress(OSError):
                    st = lower.stat()
                    os.chown(here, st.st_uid, st.st_gid)
                    os.chmod(here, st.st_mode & 0o7777)
        return here

    def _write_upper_config(self) -> None:
        units = self._upper_dir("/etc/systemd/system")
        for unit in self.masks:
            link = units / unit
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to("/dev/null")
        (units / TARGET).write_text(TARGET_UNIT)
        default = units / "default.target"
        if default.is_symlink() or default.exists():
            default.unlink()
        where = "/etc/systemd/system" if self.target == TARGET else "/lib/systemd/system"
        default.symlink_to(f"{where}/{self.target}")
        etc = self._upper_dir("/etc")
        machine_id = etc / "machine-id"
        # Its own machine id: its own journal files, never the host's.
        if not machine_id.exists() or not machine_id.read_text().strip():
            machine_id.write_text(uuid.uuid4().hex + "\n")
        (etc / "hostname").write_text(self.hostname + "\n")
        # The host's fstab and crypttab name the host's disks: none of them here.
        (etc / "fstab").write_text("# llmgw private systemd: the harness does the mounts\n")
        if Path("/etc/crypttab").exists():
            (etc / "crypttab").write_text("")

    def _make_cgroups(self) -> tuple[list[str], list[str]]:
        """Our own subtree in each hierarchy, and the mounts that show it inside."""
        mounts: list[str] = []
        procs: list[str] = []
        for h in _cgroup_hierarchies():
            sub = Path(f"{h.mountpoint}{h.path.rstrip('/')}/llmgw-{self.name}")
            if not host_has_systemd():
                sub.mkdir(exist_ok=True)
                self._cgroups.append(sub)
                # A v1 cpuset child starts with no CPUs: give it the parent's.
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    if (sub / knob).exists():
                        (sub / knob).write_text((sub.parent / knob).read_text())
                procs.append(str(sub / "cgroup.procs"))
            name = "." if h.mountpoint == Path("/sys/fs/cgroup") else h.mountpoint.name
            mounts += [h.fstype, h.options, name]
        return mounts, procs

    def _spawn(self) -> None:
        mounts, procs = self._make_cgroups()
        binds: list[str] = []
        for b in self.binds:
            target = b.target or b.source
            if not target.is_absolute() or ".." in target.parts:
                raise HarnessError(f"bind target {target}: must be absolute, without '..'")
            binds += [str(b.source.resolve()), str(target), "ro" if b.readonly else "rw"]
        unshare = [
            "unshare", "--fork", "--kill-child=SIGKILL", "--pid", "--mount", "--uts",
            "--ipc", "--cgroup", "--propagation", "private",
        ]  # fmt: skip
        if self.net:
            unshare.append("--net")
        inner = [*unshare, "bash", "-c", INNER, "inner", str(self.directory),
                 *mounts, "--", *binds, "--", self.hostname]  # fmt: skip
        if host_has_systemd():
            # systemd owns the host's cgroups: ask it for a delegated scope to live in.
            argv = ["systemd-run", "--scope", "--quiet", "--collect", "-p", "Delegate=yes",
                    f"--unit=llmgw-{self.name}-{os.getpid()}", *inner]  # fmt: skip
        else:
            argv = ["bash", "-c", 'n=$1; shift; for f in "${@:1:$n}"; do echo $$ > "$f"; done;'
                    ' shift "$n"; exec "$@"', "outer", str(len(procs)), *procs, *inner]  # fmt: skip
        log = (self.directory / "launcher.log").open("ab")
        self._launcher = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
        log.close()
        self._launcher_pid = self._launcher.pid
        deadline = time.monotonic() + 15
        while True:
            kids = _children(self._launcher.pid)
            if kids and _alive(kids[0], self.root):
                self._pid = kids[0]
                break
            if self._launcher.poll() is not None or time.monotonic() > deadline:
                raise HarnessError(
                    f"{self.name}: systemd did not start (launcher exit "
                    f"{self._launcher.poll()}):\n{_tail(self._read('launcher.log'))}"
                )
            time.sleep(0.05)
        self._save_state()

    def _save_state(self) -> None:
        state = {
            "name": self.name,
            "pid": self._pid,
            "launcher": self._launcher_pid,
            "cgroups": [str(c) for c in self._cgroups],
            "net": self.net,
            "persistent": self.persistent,
            "owner": os.getpid(),
        }
        tmp = self.directory / "state.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(self.directory / "state.json")
        (self.directory / "pid").write_text(f"{self._pid}\n")

    def _read(self, name: str) -> str:
        try:
            return (self.directory / name).read_text(errors="replace")
        except OSError:
            return ""

    def _wait_running(self) -> None:
        deadline = time.monotonic() + self.boot_timeout
        state = ""
        while time.monotonic() < deadline:
            if not self.alive():
                raise HarnessError(
                    f"{self.name}: systemd exited while booting:\n"
                    f"{_tail(self._read('console'))}\n{_tail(self._read('launcher.log'))}"
                )
            r = self.run(["systemctl", "is-system-running"], check=False, timeout=10)
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                return
            if state in ("maintenance", "stopping"):
                break
            time.sleep(0.2)
        report = [f"{self.name}: systemd is {state or 'unreachable'} after {self.boot_timeout}s"]
        for cmd in (["systemctl", "list-jobs", "--no-pager"],
                    ["systemctl", "--failed", "--no-pager"],
                    ["journalctl", "-b", "--no-pager", "-n", "60"]):  # fmt: skip
            r = self.run(cmd, check=False, timeout=10)
            report.append(f"--- {shlex.join(cmd)} ---\n{r.stdout}{r.stderr}")
        report.append(f"--- console ---\n{_tail(self._read('console'))}")
        raise HarnessError("\n".join(report))

    def shutdown(self, *, remove: bool | None = None) -> None:
        """Power it off (kill it if it will not), then remove its cgroups and its directory.

        Safe to call more than once, and after a failed boot. remove defaults to True
        unless the instance is persistent.
        """
        if remove is None:
            remove = not self.persistent
        problems: list[str] = []
        pids = [p for p in (self._pid, self._launcher_pid) if p is not None]
        if self._pid is not None and _alive(self._pid, self.root):
            # SIGRTMIN+4 is systemd's "poweroff": units stop in order, then it exits.
            os.kill(self._pid, signal.SIGRTMIN + 4)
            if not _wait_for([self._pid], 30):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._pid, signal.SIGKILL)  # ends the whole pid namespace
        if self._launcher is not None:
            try:
                self._launcher.wait(10)
            except subprocess.TimeoutExpired:
                self._launcher.kill()  # --kill-child takes the namespace down with it
                self._launcher.wait(10)
        elif self._launcher_pid is not None and _pid_alive(self._launcher_pid):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{self._launcher_pid}/comm").read_text().strip() == "unshare":
                    os.kill(self._launcher_pid, signal.SIGKILL)
        if not _wait_for(pids, 10):
            problems.append(f"processes {pids} would not exit")
        # The mounts live only in the private mount namespace: gone when its last process is.
        deadline = time.monotonic() + 10
        while (left := _mountpoints_under(self.directory)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if left:
            problems.append(f"mounts left under {self.directory}: {left}")
        problems += self._remove_cgroups()
        if not self.net and remove:
            _drop_host_firewall()
        self._pid = None
        self._launcher = None
        self._launcher_pid = None
        if remove and not left:
            self._remove_directory()
        elif (self.directory / "state.json").exists() and not problems:
            (self.directory / "state.json").unlink()
            (self.directory / "pid").unlink(missing_ok=True)
        if problems:
            raise HarnessError(f"{self.name}: shutdown incomplete: " + "; ".join(problems))

    def _remove_cgroups(self) -> list[str]:
        problems = []
        for top in self._cgroups:
            if not top.exists():
                continue
            deadline = time.monotonic() + 5
            while True:
                try:
                    # Deepest first; a cgroup is a directory that rmdir takes when empty.
                    for d in sorted(
                        (p for p in top.rglob("*") if p.is_dir()),
                        key=lambda p: len(p.parts),
                        reverse=True,
                    ):
                        d.rmdir()
                    top.rmdir()
                    break
                except OSError as e:
                    if time.monotonic() > deadline:
                        problems.append(f"cgroup {top}: {e}")
                        break
                    time.sleep(0.1)
        self._cgroups = [c for c in self._cgroups if c.exists()]
        return problems

    def _remove_directory(self) -> None:
        if not self.directory.exists():
            return
        left = _mountpoints_under(self.directory)
        if left:
            raise HarnessError(f"not removing {self.directory}: still mounted in {left}")
        shutil.rmtree(self.directory)

    # -- use -------------------------------------------------------------------

    def nsenter(self) -> list[str]:
        """The command prefix that runs a command inside, as systemd's own children see it.
        Python there never puts the working directory (systemd's: /) first on its path
        (PYTHONSAFEPATH): a stray module left in the host's / is not imported instead of an
        installed one (an `openai/` left there once failed every test that ran the client)."""
        return ["nsenter", "-t", str(self.pid), "-a", "-r", "-w", "--",
                "env", "-i", f"PATH={CONTAINER_PATH}", "HOME=/root", "LANG=C.UTF-8",
                "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "PYTHONSAFEPATH=1"]  # fmt: skip

    def run(
        self,
        cmd: Sequence[str] | str,
        *,
        check: bool = True,
        timeout: float = 60.0,
        input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run cmd (a list, or a string for bash -c) inside; CommandFailed when check fails."""
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        extra = [f"{k}={v}" for k, v in (env or {}).items()]
        full = [*self.nsenter(), *extra, *argv]
        try:
            r = subprocess.run(
                full,
                input=input,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=None if input is not None else subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else ""
            raise HarnessError(
                f"{self.name}: {shlex.join(argv)} ran past {timeout}s\n{_tail(out)}"
            ) from None
        if check and r.returncode != 0:
            raise CommandFailed(argv, r.returncode, r.stdout, r.stderr)
        return r

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """systemctl inside, without a pager."""
        return self.run(["systemctl", "--no-pager", *args], check=check)

    def journal(self, unit: str | None = None, lines: int = 50) -> str:
        """The last lines of the journal inside (of one unit, or all of it)."""
        cmd = ["journalctl", "--no-pager", "-o", "short-monotonic", "-n", str(lines)]
        if unit:
            cmd += ["-u", unit]
        r = self.run(cmd, check=False)
        return r.stdout + r.stderr

    def write_file(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write a file inside (its writes land in the upper layer, never on the host).

        Before boot it goes straight into the upper layer; once booted it is written from
        inside, because /proc/PID/root would resolve absolute symlinks on the host.
        """
        if not path.startswith("/"):
            raise ValueError(f"{path}: want an absolute path inside")
        if self._pid is None:
            target = self._upper_dir(os.path.dirname(path)) / os.path.basename(path)
            target.write_text(text)
            target.chmod(mode)
            return
        self.run(
            ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"',
             "sh", path, f"{mode:o}"],
            input=text,
        )  # fmt: skip

    def read_file(self, path: str) -> str:
        """A file's text as the private systemd sees it."""
        return self.run(["cat", "--", path]).stdout

    def wait_active(self, unit: str, timeout: float = 30.0) -> None:
        """Wait until unit is active; HarnessError with its status and journal if not."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.systemctl("is-active", unit, check=False).stdout.strip()
            if state == "active":
                return
            if state == "failed":
                break
            time.sleep(0.2)
        status = self.systemctl("status", unit, check=False).stdout
        raise HarnessError(f"{unit} is {state}\n{status}\n{self.journal(unit, 40)}")


def shutdown_all(systemds: Sequence[PrivateSystemd]) -> list[str]:
    """Power off every one at once (each waits on its own units' stops); what went wrong."""
    errors: list[str] = []

    def one(ps: PrivateSystemd) -> None:
        try:
            ps.shutdown()
        except Exception as e:
            errors.append(f"{ps.name}: {e}")

    with ThreadPoolExecutor(max_workers=max(1, len(systemds))) as pool:
        list(pool.map(one, systemds))
    return errors


def drop_in(exe: Path) -> str:
    """The drop-in that runs a checkout's entry point instead of the package's /usr/bin one.

    scripts/quickstart writes the same one. The checkout may sit under /home or /root,
    which llmgwd's ProtectHome=yes would hide.
    """
    return f"[Service]\nExecStart=\nExecStart={exe}\nProtectHome=read-only\n"


def install_units(ps: PrivateSystemd, *, venv: Path | None = None) -> None:
    """Install units/ into ps as the packages would; with venv, run that venv's daemons."""
    units = REPO / "units"
    for f in sorted(units.iterdir()):
        if f.suffix in (".service", ".slice"):
            ps.write_file(f"/etc/systemd/system/{f.name}", f.read_text())
    ps.write_file("/etc/sysusers.d/llmgw.conf", (units / "llmgw.sysusers.conf").read_text())
    ps.write_file("/etc/tmpfiles.d/llmgw.conf", (units / "llmgw.tmpfiles.conf").read_text())
    if venv is not None:
        for unit in ("llmgwd", "llmgw-agentd"):
            text = drop_in(venv / "bin" / unit)
            ps.write_file(f"/etc/systemd/system/{unit}.service.d/checkout.conf", text)
    ps.run(["systemd-sysusers", "/etc/sysusers.d/llmgw.conf"])
    ps.run(["systemd-tmpfiles", "--create", "/etc/tmpfiles.d/llmgw.conf"])
    ps.systemctl("daemon-reload")


SYSTEM_CACHE = "/var/cache/llmgw-agent"  # llmgw_agentd.layout.CACHE


def install_llama_server(ps: PrivateSystemd, binary: Path) -> str:
    """Copy a built llama-server (CACHE/llama.cpp/VERSION-ARCH/llama-server) into ps's
    world-readable /var/cache/llmgw-agent, where the agent finds it and a dynamic user may run it.
    The source must be visible inside (a bind mount, or on the root filesystem).
    """
    rel = binary.relative_to(binary.parents[2])  # llama.cpp/VERSION-ARCH/llama-server
    target = f"{SYSTEM_CACHE}/{rel}"
    ps.run(["install", "-D", "-m", "0755", str(binary), target])
    return target


class Lan:
    """A network namespace with a bridge: private systemds with net=True attach to it.

    Every address lives on links made here, inside namespaces made here; the host's own
    network is never touched.
    """

    def __init__(self, name: str, prefix: str = "10.231.0") -> None:
        self.netns = f"llmgw-{_safe(name)}"
        self.prefix = prefix
        self._links = 0

    def __enter__(self) -> Lan:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", "-n", self.netns, *args], check=True, capture_output=True)

    def create(self) -> None:
        """Make the namespace and its bridge."""
        subprocess.run(["ip", "netns", "add", self.netns], check=True, capture_output=True)
        self._ip("link", "set", "lo", "up")
        self._ip("link", "add", "br0", "type", "bridge")
        self._ip("link", "set", "br0", "up")

    def attach(self, ps: PrivateSystemd, host: int) -> str:
        """Give ps an eth0 on this lan with address PREFIX.host/24; returns the address."""
        if not ps.net:
            raise HarnessError(f"{ps.name}: shares the host's network; boot it with net=True")
        self._links += 1
        veth = f"lv{self._links}-{os.getpid() % 100000}"[:15]
        address = f"{self.prefix}.{host}"
        self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0",
                 "netns", str(ps.pid))  # fmt: skip
        self._ip("link", "set", veth, "master", "br0", "up")
        ps.run(["ip", "addr", "add", f"{address}/24", "dev", "eth0"])
        ps.run(["ip", "link", "set", "eth0", "up"])
        return address

    def destroy(self) -> None:
        """Remove the namespace (the links in it go with it)."""
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, check=False)


# What the make_systemd and make_lan fixtures give a test.
MakeSystemd = Callable[..., PrivateSystemd]
MakeLan = Callable[..., Lan]


def reap_stale(base: Path = TEST_BASE) -> list[str]:
    """Shut down test systemds whose owning process died without cleaning up."""
    reaped: list[str] = []
    if not base.is_dir():
        return reaped
    for d in sorted(base.iterdir()):
        try:
            state = json.loads((d / "state.json").read_text())
        except (OSError, ValueError):
            continue
        if state.get("persistent") or _pid_alive(int(state.get("owner", 0)) or -1):
            continue
        with contextlib.suppress(HarnessError):
            PrivateSystemd.attach(d).shutdown(remove=True)
            reaped.append(d.name)
    return reaped


@contextlib.contextmanager
def booted(name: str, **kwargs: object) -> Iterator[PrivateSystemd]:
    """A booted private systemd for the with-block, shut down and removed after it."""
    ps = PrivateSystemd(name, **kwargs)  # type: ignore[arg-type]
    try:
        ps.boot()
        yield ps
    finally:
        ps.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """The command line scripts/quickstart uses: up, down, status, exec."""
    p = argparse.ArgumentParser(prog="harness.py", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="boot (or find running) a persistent private systemd")
    up.add_argument("--dir", type=Path, required=True)
    up.add_argument("--name", required=True)
    up.add_argument("--bind", action="append", default=[], metavar="SRC[:DST][:ro]")
    up.add_argument("--net", action="store_true")
    for cmd in ("down", "status", "exec"):
        s = sub.add_parser(cmd)
        s.add_argument("--dir", type=Path, required=True)
        if cmd == "exec":
            s.add_argument("argv", nargs="+")
    a = p.parse_args(argv)
    try:
        if a.command == "up":
            with contextlib.suppress(HarnessError):
                running = PrivateSystemd.attach(a.dir)
                if running.alive():
                    print(running.pid)
                    return 0
            ps = PrivateSystemd(
                a.name,
                directory=a.dir,
                binds=[Bind.parse(b) for b in a.bind],
                net=a.net,
                persistent=True,
            )
            try:
                ps.boot()
            except BaseException:
                ps.shutdown(remove=False)
                raise
            print(ps.pid)
            return 0
        if a.command == "down":
            if not a.dir.exists():
                return 0
            try:
                PrivateSystemd.attach(a.dir).shutdown(remove=True)
            except HarnessError:
                PrivateSystemd("down", directory=a.dir)._remove_directory()
            return 0
        ps = PrivateSystemd.attach(a.dir)
        if not ps.alive():
            print(f"{a.dir}: not running", file=sys.stderr)
            return 1
        if a.command == "status":
            print(ps.pid)
            return 0
        return subprocess.call([*ps.nsenter(), *a.argv])
    except HarnessError as e:
        print(f"harness: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
