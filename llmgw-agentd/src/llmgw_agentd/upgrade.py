"""The node's part in `llmgw upgrade`: the staged packages of its packaging kind fetched from the
mirror (a cut resumed by Range, checked by sha256), installed by a transient unit, reported."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec
from dbus_fast import Variant

from llmgw import download, package_version, wire
from llmgw.blobstore import BlobStore, BlobStoreError
from llmgw_agentd.cache import FILES_PATH, Mirror
from llmgw_agentd.systemd import Systemd, SystemdError, UnitState
from llmgw_agentd.upgrade_repo import Order

log = logging.getLogger(__name__)

UNIT_PREFIX = "llmgw-upgrade-"
INSTALL_LIMIT_S = 1800  # the install unit's RuntimeMaxSec
# What apt-get and dnf are run with (by absolute path, as a transient unit's ExecStart is
# given): no question asked, a changed configuration file kept.
APT = ("/usr/bin/apt-get", "install", "-y", "-o", "Dpkg::Options::=--force-confold")
DNF = ("/usr/bin/dnf", "install", "-y")

Report = Callable[[wire.UpgradeReport], None]
Installed = Callable[[str, str], Awaitable[bool]]  # (kind, package name) -> installed here
Command = Callable[[str, Sequence[Path]], list[str]]  # (kind, files) -> the unit's argv
RepoCommand = Callable[[Path], list[str]]  # (order file) -> the unit's argv
NAMES = ("llmgw", "llmgwd", "llmgw-agentd")  # the packages `llmgw upgrade` installs
ORDER = "repository-order.json"


def host_kind() -> str:
    """The host's packaging: "deb" where apt-get is, "rpm" where dnf is, "" neither."""
    if shutil.which("apt-get") and shutil.which("dpkg-query"):
        return "deb"
    return "rpm" if shutil.which("dnf") and shutil.which("rpm") else ""


async def installed(kind: str, name: str) -> bool:
    """Whether package `name` is installed (dpkg-query, rpm -q)."""
    argv = (
        ["dpkg-query", "-W", "-f=${db:Status-Status}", name]
        if kind == "deb"
        else ["rpm", "-q", name]
    )
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    out, _ = await proc.communicate()
    if kind == "deb":
        return proc.returncode == 0 and out.strip() == b"installed"
    return proc.returncode == 0


def unit_name(roll: str, attempt: int) -> str:
    """The install's transient unit: one a try, so a failed one's record stays to be read."""
    return f"{UNIT_PREFIX}{roll}-{attempt}.service"


def install_command(kind: str, files: Sequence[Path]) -> list[str]:
    """apt-get install -y ./FILE... or dnf install -y ./FILE... (paths, never names: the
    files are installed, not whatever a repository has)."""
    return [*(APT if kind == "deb" else DNF), *(str(f) for f in files)]


def repo_command(order: Path) -> list[str]:
    """The install from the repositories: this agent's Python running upgrade_repo on the
    order (apt-get or dnf run from there, through the order's proxy)."""
    return [sys.executable, "-m", "llmgw_agentd.upgrade_repo", str(order)]


def unit_properties(
    roll: str, kind: str, where: Path, what: str = "the staged packages"
) -> list[tuple[str, Variant]]:
    """The install unit: a unit of its own (not in the agent's cgroup), so that the package's
    restart of llmgw-agentd does not stop it; kept when it fails, for its result."""
    env = ["DEBIAN_FRONTEND=noninteractive"] if kind == "deb" else []
    return [
        ("Description", Variant("s", f"llmgw upgrade {roll}: install {what}")),
        ("Type", Variant("s", "exec")),
        ("WorkingDirectory", Variant("s", str(where))),
        ("Environment", Variant("as", env)),
        ("RuntimeMaxUSec", Variant("t", INSTALL_LIMIT_S * 1_000_000)),
        # Not stopped with the agent, nor killed by its restart: apt-get runs to its end.
        ("KillMode", Variant("s", "mixed")),
        ("SendSIGHUP", Variant("b", False)),
    ]


@dataclass
class _Try:
    msg: wire.Upgrade
    done: int = 0
    total: int = 0


class Upgrader:
    """Runs one Upgrade at a time; the same roll and try again carries on where it is (a
    fetched package is not fetched again; an install unit running is waited for)."""

    def __init__(
        self,
        root: Path,
        systemd: Systemd,
        mirror: Callable[[], Mirror],
        report: Report,
        *,
        kind: str | None = None,
        is_installed: Installed = installed,
        command: Command | None = None,
        repo: RepoCommand = repo_command,
        proxy_env: dict[str, str] | None = None,
        tick_s: float = 1.0,
    ) -> None:
        self._store: BlobStore | None = None  # made at the first Upgrade
        self.root = root
        self._systemd = systemd
        self._mirror = mirror
        self._report = report
        self._kind = host_kind() if kind is None else kind
        self._installed = is_installed
        self._command = command or install_command
        self._repo = repo
        self._proxy_env = dict(proxy_env or {})  # network.proxy's, for apt-get or dnf
        self._tick_s = tick_s
        self._task: asyncio.Task[None] | None = None
        self._key: tuple[str, int] | None = None
        self._connected = False  # to systemd's bus

    @property
    def store(self) -> BlobStore:
        """root/blobs: the packages fetched, by sha256."""
        if self._store is None:
            self._store = BlobStore(self.root)
        return self._store

    def start(self, msg: wire.Upgrade) -> None:
        """Take an Upgrade: a new roll or try replaces one in hand."""
        if self._task is not None and not self._task.done():
            if self._key == (msg.roll, msg.attempt):
                return
            self._task.cancel()
        self._key = (msg.roll, msg.attempt)
        self._task = asyncio.create_task(self.run(msg), name=f"upgrade {msg.roll}")

    async def run(self, msg: wire.Upgrade) -> None:
        """Fetch, install, report; every failure is reported with its why."""
        t = _Try(msg)
        try:
            await self._run(t)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # reported, never lost: the roll halts on it
            log.exception("upgrade %s failed", msg.roll)
            self._tell(t, "failed", _why(e))

    async def _run(self, t: _Try) -> None:
        if package_version() == t.msg.release:
            # This agent was started by the install (or the host is on it already): the
            # install unit of this try, if it still runs, is waited for and its end said.
            result = await self._install(t.msg, start=False)
            self._tell(t, "failed" if result else "restarting", result or f"on {t.msg.release}")
            return
        if t.msg.from_repositories:
            await self._from_repositories(t)
            return
        packages = await self._chosen(t.msg.packages)
        t.total = sum(p.size for p in packages)
        files = await self._fetch_all(t, packages)
        self._tell(t, "installing", " ".join(p.filename for p in packages))
        argv = self._command(self._kind, files)
        props = unit_properties(t.msg.roll, self._kind, files[0].parent)
        self._finish(t, await self._install(t.msg, argv, props))

    async def _from_repositories(self, t: _Try) -> None:
        """The node's llmgw packages at the roll's release from its own repositories, in
        the same kind of unit; the proxy goes in a 0600 order the unit reads (and removes)."""
        version = t.msg.version or t.msg.release
        if not wire.repository_version_ok(version):
            raise UpgradeError(f"not a package version: {version[:80]!r}")
        if not self._kind:
            raise UpgradeError("this host has neither apt-get nor dnf")
        names = [n for n in NAMES if await self._installed(self._kind, n)]
        if not names:
            raise UpgradeError(f"none of {', '.join(NAMES)} is installed here")
        where = self.store.root / f"install-{t.msg.roll}"
        where.mkdir(mode=0o755, exist_ok=True)
        order = Order(kind=self._kind, names=names, version=version, proxy_env=self._proxy_env)
        path = where / ORDER
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(msgspec.json.encode(order))
        sep = "=" if self._kind == "deb" else "-"
        self._tell(t, "installing", " ".join(f"{n}{sep}{version}" for n in names))
        what = f"{version} from the repositories"
        props = unit_properties(t.msg.roll, self._kind, where, what)
        try:
            result = await self._install(t.msg, self._repo(path), props)
        finally:
            path.unlink(missing_ok=True)  # the unit removes it once read; else here
        self._finish(t, result)

    def _finish(self, t: _Try, result: str) -> None:
        if result:
            self._tell(t, "failed", result)
            return
        # The package's own scripts restart llmgw-agentd (and llmgwd); the new agent's
        # Register says its release, which the leader takes as done.
        self._tell(t, "restarting", f"installed {t.msg.release}")

    async def _chosen(self, staged: Sequence[wire.UpgradePackage]) -> list[wire.UpgradePackage]:
        """The packages of this host's kind whose names are installed here."""
        if not self._kind:
            raise UpgradeError("this host has neither apt-get nor dnf")
        ours = [p for p in staged if p.kind == self._kind]
        chosen = [p for p in ours if await self._installed(self._kind, p.name)]
        if not chosen:
            names = ", ".join(sorted({p.name for p in ours})) or f"no .{self._kind} was staged"
            raise UpgradeError(f"none of the staged packages is installed here ({names})")
        return chosen

    async def _fetch_all(self, t: _Try, packages: Sequence[wire.UpgradePackage]) -> list[Path]:
        where = self.store.root / f"install-{t.msg.roll}"
        where.mkdir(mode=0o755, exist_ok=True)
        files = []
        before = 0
        async with aiohttp.ClientSession() as session:
            for p in packages:
                await self._fetch(session, t, p, before)
                before += p.size
                files.append(_link(self.store.path(p.sha256), where / _safe(p.filename)))
        return files

    async def _fetch(
        self, session: aiohttp.ClientSession, t: _Try, p: wire.UpgradePackage, before: int
    ) -> None:
        """One package from the first control plane that has it, its progress told."""
        want = wire.ModelFile(path=p.filename, size=p.size, sha256=p.sha256)

        def progress(done: int) -> None:
            t.done = before + done

        ticker = asyncio.create_task(self._ticks(t))
        try:
            await self._from_any(session, want, progress)
        finally:
            ticker.cancel()
        t.done = before + p.size
        self._tell(t, "fetching")

    async def _from_any(
        self, session: aiohttp.ClientSession, want: wire.ModelFile, progress: download.Progress
    ) -> None:
        mirror = self._mirror()
        failure: Exception | None = None
        for url in mirror.urls:
            try:
                await download.fetch(
                    session,
                    f"{url}{FILES_PATH}{want.sha256}",
                    self.store,
                    want,
                    progress=progress,
                    ssl=mirror.ssl,
                )
                return
            except download.DownloadError as e:
                failure = e
        raise UpgradeError(f"cannot fetch {want.path}: {failure}")

    async def _ticks(self, t: _Try) -> None:
        while True:
            self._tell(t, "fetching")
            await asyncio.sleep(self._tick_s)

    async def _install(
        self,
        msg: wire.Upgrade,
        argv: Sequence[str] = (),
        props: Sequence[tuple[str, Variant]] = (),
        start: bool = True,
    ) -> str:
        """Run the install unit, argv (or wait for one of this try already running; start
        False: only that); "" when it ended well (or none is loaded), else why."""
        name = unit_name(msg.roll, msg.attempt)
        changed = asyncio.Event()
        if not self._connected:
            await self._systemd.connect()
            self._connected = True
        unwatch = self._systemd.watch(name, lambda _: changed.set())
        try:
            if start and (await self._state(name)).removed:  # else: this try's, left running
                await self._systemd.start_transient(name, argv, props)
            while True:
                changed.clear()
                st = await self._state(name)
                if st.removed or (st.ended and st.result == "success"):
                    return ""  # a transient unit that ended well is unloaded at once
                if st.ended:
                    return f"{name}: {st.describe()}{await _journal_tail(name)}"
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), 5.0)
        finally:
            unwatch()

    async def _state(self, name: str) -> UnitState:
        """The unit's state; one unloaded between the two calls of a read is removed."""
        try:
            return await self._systemd.state(name)
        except SystemdError as e:
            if e.name != "org.freedesktop.DBus.Error.UnknownObject":
                raise
            return UnitState(name, removed=True)

    def _tell(self, t: _Try, step: wire.UpgradeStep, message: str = "") -> None:
        report = wire.UpgradeReport(t.msg.roll, t.msg.attempt, step, t.done, t.total, message)
        self._report(report)

    async def close(self) -> None:
        """Stop the Upgrade in hand (its install unit, a unit of its own, runs on)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class UpgradeError(Exception):
    """This node cannot take the Upgrade; the message is its why."""


def _safe(filename: str) -> str:
    """A package's file name as a name in one directory (no path)."""
    name = os.path.basename(filename)
    if not name or name.startswith(".") or not name.endswith((".deb", ".rpm")):
        raise UpgradeError(f"not a package's file name: {filename[:80]!r}")
    return name


def _link(blob: Path, path: Path) -> Path:
    """The blob under the package's own name (apt-get and dnf go by the suffix)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    try:
        os.link(blob, path)
    except OSError:
        path.symlink_to(blob)
    return path


async def _journal_tail(unit: str) -> str:
    """The install's last lines from the journal, for the failure's why ("" none)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            "journalctl", "-u", unit, "-n", "3", "-o", "cat", "--no-pager",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), 10.0)
    except (OSError, TimeoutError):
        return ""
    lines = [ln for ln in out.decode("utf-8", "replace").splitlines() if not ln.startswith("-- ")]
    return f": {' / '.join(lines)}" if lines else ""


def _why(e: BaseException) -> str:
    if isinstance(e, (UpgradeError, BlobStoreError, SystemdError)):
        return str(e)
    return f"{type(e).__name__}: {e}"
