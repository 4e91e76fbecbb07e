"""A fake systemd manager on a private dbus-daemon: runs a transient unit's argv as a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import os
import re
import shutil
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from dbus_fast import BusType, DBusError
from dbus_fast.aio import MessageBus
from dbus_fast.annotations import DBusInt32, DBusObjectPath, DBusSignature, DBusStr, DBusUInt32
from dbus_fast.constants import PropertyAccess
from dbus_fast.service import ServiceInterface, dbus_method, dbus_property, dbus_signal

BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={path}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
  </policy>
</busconfig>
"""

NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"
UNIT_EXISTS = "org.freedesktop.systemd1.UnitExists"
# systemd counts these deaths as a clean stop of a service (SuccessExitStatus's defaults).
CLEAN_SIGNALS = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE}

PropList = Annotated[list[Any], DBusSignature("a(sv)")]
AuxList = Annotated[list[Any], DBusSignature("a(sa(sv))")]
StrList = Annotated[list[str], DBusSignature("as")]
UnitList = Annotated[list[Any], DBusSignature("a(ssssssouso)")]
JobRemovedArgs = Annotated[tuple[int, str, str, str], DBusSignature("uoss")]
UnitArgs = Annotated[tuple[str, str], DBusSignature("so")]
NoReply = Annotated[None, DBusSignature("")]  # dbus-fast reads a bare "None" as no signature


def unit_path(name: str) -> str:
    """systemd's object path of a unit (written again here, independent of the code under test)."""
    esc = "".join(
        c if c.isascii() and (c.isalpha() or (c.isdigit() and i)) else f"_{ord(c):02x}"
        for i, c in enumerate(name)
    )
    return "/org/freedesktop/systemd1/unit/" + esc


@asynccontextmanager
async def dbus_daemon(tmp: Path) -> AsyncIterator[str]:
    """A private dbus-daemon; yields its address."""
    sock = tmp / "bus"
    conf = tmp / "bus.conf"
    conf.write_text(BUS_CONFIG.format(path=sock))
    proc = await asyncio.create_subprocess_exec(
        "dbus-daemon",
        f"--config-file={conf}",
        "--nofork",
        "--print-address",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    address = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode().strip()
    try:
        yield address
    finally:
        proc.terminate()
        await proc.wait()


class _UnitIface(ServiceInterface):
    def __init__(self, unit: FakeUnit) -> None:
        super().__init__("org.freedesktop.systemd1.Unit")
        self.u = unit

    @dbus_property(access=PropertyAccess.READ)
    def Id(self) -> DBusStr:
        return self.u.name

    @dbus_property(access=PropertyAccess.READ)
    def Description(self) -> DBusStr:
        return str(self.u.properties.get("Description", ""))

    @dbus_property(access=PropertyAccess.READ)
    def LoadState(self) -> DBusStr:
        return "loaded"

    @dbus_property(access=PropertyAccess.READ)
    def ActiveState(self) -> DBusStr:
        return self.u.active_state

    @dbus_property(access=PropertyAccess.READ)
    def SubState(self) -> DBusStr:
        return self.u.sub_state


class _ServiceIface(ServiceInterface):
    def __init__(self, unit: FakeUnit) -> None:
        super().__init__("org.freedesktop.systemd1.Service")
        self.u = unit

    @dbus_property(access=PropertyAccess.READ)
    def MainPID(self) -> DBusUInt32:
        return self.u.pid if self.u.active_state == "active" else 0

    @dbus_property(access=PropertyAccess.READ)
    def ExecMainPID(self) -> DBusUInt32:
        return self.u.pid

    @dbus_property(access=PropertyAccess.READ)
    def ExecMainCode(self) -> DBusInt32:
        return self.u.exit_code

    @dbus_property(access=PropertyAccess.READ)
    def ExecMainStatus(self) -> DBusInt32:
        return self.u.exit_status

    @dbus_property(access=PropertyAccess.READ)
    def Result(self) -> DBusStr:
        return self.u.result


@dataclass(eq=False)
class FakeUnit:
    """A transient service of the fake, with the properties it was started with."""

    name: str
    properties: dict[str, Any]
    active_state: str = "inactive"
    sub_state: str = "dead"
    result: str = "success"
    pid: int = 0
    exit_code: int = 0
    exit_status: int = 0
    stopping: bool = False
    oom: bool = False  # killed as the kernel's OOM killer does: Result=oom-kill
    proc: asyncio.subprocess.Process | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    ifaces: tuple[_UnitIface, _ServiceIface] | None = None


class FakeSystemd(ServiceInterface):
    """org.freedesktop.systemd1.Manager, the subset llmgw-agentd uses."""

    def __init__(self, bus: MessageBus, runtime: Path) -> None:
        super().__init__("org.freedesktop.systemd1.Manager")
        self.bus = bus
        self.runtime = runtime
        self.units: dict[str, FakeUnit] = {}
        self.started: list[str] = []  # every StartTransientUnit accepted, in order
        self.subscribed = 0
        self.reloads = 0  # Reload (daemon-reload) calls
        self.file_jobs: list[tuple[str, str]] = []  # (StartUnit|RestartUnit, unit) of units
        self._job = 0
        self._tasks: set[asyncio.Task[None]] = set()

    # What tests use

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill a unit's main process, as an OOM killer or a crash would."""
        os.kill(self.units[name].pid, sig)

    def oom_kill(self, name: str) -> None:
        """Kill a unit's main process as the kernel does over MemoryMax: systemd then says
        Result=oom-kill (its cgroup's memory.events counted an oom_kill)."""
        self.units[name].oom = True
        self.kill(name)

    async def shutdown(self) -> None:
        """Kill every unit's process (the end of a test)."""
        for u in list(self.units.values()):
            if u.proc is not None and u.proc.returncode is None:
                u.proc.kill()
                await u.proc.wait()
        for t in list(self._tasks):
            t.cancel()

    # The D-Bus API

    @dbus_method()
    def Subscribe(self) -> NoReply:
        self.subscribed += 1

    @dbus_method()
    def StartTransientUnit(
        self, name: DBusStr, mode: DBusStr, properties: PropList, aux: AuxList
    ) -> DBusObjectPath:
        if name in self.units:
            raise DBusError(UNIT_EXISTS, f"Unit {name} was already loaded or has a fragment file.")
        u = FakeUnit(name, {k: v.value for k, v in properties})
        u.ifaces = (_UnitIface(u), _ServiceIface(u))
        for iface in u.ifaces:
            self.bus.export(unit_path(name), iface)
        self.units[name] = u
        self.started.append(name)
        self.UnitNew(name, unit_path(name))
        job, path = self._new_job()
        self._spawn(self._run(u, job, path))
        return path

    @dbus_method()
    def StopUnit(self, name: DBusStr, mode: DBusStr) -> DBusObjectPath:
        u = self._unit(name)
        job, path = self._new_job()
        self._spawn(self._stop(u, job, path))
        return path

    @dbus_method()
    def StartUnit(self, name: DBusStr, mode: DBusStr) -> DBusObjectPath:
        return self._file_job("StartUnit", name)

    @dbus_method()
    def RestartUnit(self, name: DBusStr, mode: DBusStr) -> DBusObjectPath:
        return self._file_job("RestartUnit", name)

    @dbus_method()
    def Reload(self) -> NoReply:
        self.reloads += 1

    def _file_job(self, member: str, name: str) -> str:
        """A unit from files (slurmd's): only recorded; its job is done at once."""
        self.file_jobs.append((member, name))
        job, path = self._new_job()

        async def done() -> None:
            await asyncio.sleep(0)  # the method's reply goes out first
            self.JobRemoved(job, path, name, "done")

        self._spawn(done())
        return path

    @dbus_method()
    def ResetFailedUnit(self, name: DBusStr) -> NoReply:
        u = self._unit(name)
        if u.active_state == "failed":
            self._set(u, "inactive", "dead")
            self._remove(u)

    @dbus_method()
    def GetUnit(self, name: DBusStr) -> DBusObjectPath:
        self._unit(name)
        return unit_path(name)

    @dbus_method()
    def ListUnitsByPatterns(self, states: StrList, patterns: StrList) -> UnitList:
        return [
            [
                u.name,
                str(u.properties.get("Description", "")),
                "loaded",
                u.active_state,
                u.sub_state,
                "",
                unit_path(u.name),
                0,
                "",
                "/",
            ]
            for u in self.units.values()
            if (not patterns or any(fnmatch.fnmatch(u.name, p) for p in patterns))
            and (not states or u.active_state in states)
        ]

    @dbus_signal()
    def JobRemoved(self, job: int, path: str, unit: str, result: str) -> JobRemovedArgs:
        return job, path, unit, result

    @dbus_signal()
    def UnitNew(self, name: str, path: str) -> UnitArgs:
        return name, path

    @dbus_signal()
    def UnitRemoved(self, name: str, path: str) -> UnitArgs:
        return name, path

    # The unit's life

    def _unit(self, name: str) -> FakeUnit:
        if name not in self.units:
            raise DBusError(NO_SUCH_UNIT, f"Unit {name} not loaded.")
        return self.units[name]

    def _new_job(self) -> tuple[int, str]:
        self._job += 1
        return self._job, f"/org/freedesktop/systemd1/job/{self._job}"

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, u: FakeUnit, job: int, path: str) -> None:
        await asyncio.sleep(0)  # the method's reply goes out first, as systemd's does
        # systemd 252 signals a new unit as inactive/dead once, before it activates.
        self._set(u, "inactive", "dead")
        self._set(u, "activating", "start")
        try:
            argv, env = self._exec_context(u)
            u.proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            status = 243 if isinstance(e, _CredentialError) else 203
            self._exited(u, code=1, status=status, result="exit-code")
            self.JobRemoved(job, path, u.name, "failed")
            return
        u.pid = u.proc.pid
        self._set(u, "active", "running")
        self.JobRemoved(job, path, u.name, "done")
        rc = await u.proc.wait()
        if rc >= 0:
            self._exited(u, code=1, status=rc, result="success" if rc == 0 else "exit-code")
        else:
            sig = signal.Signals(-rc)
            clean = sig in CLEAN_SIGNALS or (u.stopping and sig == signal.SIGKILL)
            result = "oom-kill" if u.oom else "success" if clean else "signal"
            self._exited(u, code=2, status=-rc, result=result)

    def _exec_context(self, u: FakeUnit) -> tuple[list[str], dict[str, str]]:
        """ExecStart's argv, ${VAR}s expanded, LoadCredential= files copied: as systemd does."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        for item in u.properties.get("Environment", []):
            k, _, v = item.partition("=")
            env[k] = v
        creds = u.properties.get("LoadCredential", [])
        if creds:
            cdir = self.runtime / "credentials" / u.name
            cdir.mkdir(parents=True, exist_ok=True)
            for cred_id, src in creds:
                try:
                    shutil.copyfile(src, cdir / cred_id)
                except OSError as e:
                    raise _CredentialError(str(e)) from e
                os.chmod(cdir / cred_id, 0o400)
            env["CREDENTIALS_DIRECTORY"] = str(cdir)
        exec_start = u.properties["ExecStart"][0]
        argv = [re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), a) for a in exec_start[1]]
        return argv, env

    def _exited(self, u: FakeUnit, *, code: int, status: int, result: str) -> None:
        u.exit_code, u.exit_status, u.result = code, status, result
        failed = result != "success"
        self._set(u, "failed" if failed else "inactive", "failed" if failed else "dead")
        u.done.set()
        if not failed:  # a stopped transient unit is garbage-collected at once
            self._remove(u)

    async def _stop(self, u: FakeUnit, job: int, path: str) -> None:
        await asyncio.sleep(0)
        if u.proc is not None and u.proc.returncode is None:
            u.stopping = True
            self._set(u, "deactivating", "stop-sigterm")
            with contextlib.suppress(ProcessLookupError):
                u.proc.terminate()  # KillMode=mixed: SIGTERM to the main process first
            timeout = u.properties.get("TimeoutStopUSec", 5_000_000) / 1e6  # then SIGKILL
            try:
                await asyncio.wait_for(u.done.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(u.proc.pid, signal.SIGKILL)
                await u.done.wait()
        self.JobRemoved(job, path, u.name, "done")

    def _set(self, u: FakeUnit, active: str, sub: str) -> None:
        u.active_state, u.sub_state = active, sub
        if u.ifaces is None:
            return
        unit_iface, service_iface = u.ifaces
        # Like systemd: the Service interface's changes first, then the Unit's.
        service_iface.emit_properties_changed(
            {
                "MainPID": u.pid if active == "active" else 0,
                "ExecMainPID": u.pid,
                "ExecMainCode": u.exit_code,
                "ExecMainStatus": u.exit_status,
                "Result": u.result,
            }
        )
        unit_iface.emit_properties_changed({"ActiveState": active, "SubState": sub})

    def _remove(self, u: FakeUnit) -> None:
        if self.units.get(u.name) is not u:
            return
        del self.units[u.name]
        if u.ifaces is not None:
            for iface in u.ifaces:
                self.bus.unexport(unit_path(u.name), iface)
        self.UnitRemoved(u.name, unit_path(u.name))


class _CredentialError(OSError):
    """A LoadCredential= file that could not be read (systemd's 243/CREDENTIALS)."""


@asynccontextmanager
async def fake_systemd(tmp: Path) -> AsyncIterator[tuple[str, FakeSystemd]]:
    """A private bus with the fake systemd on it; yields (bus address, fake)."""
    async with dbus_daemon(tmp) as address:
        bus = await MessageBus(bus_address=address, bus_type=BusType.SESSION).connect()
        fake = FakeSystemd(bus, tmp / "fake-run")
        bus.export("/org/freedesktop/systemd1", fake)
        await bus.request_name("org.freedesktop.systemd1")
        try:
            yield address, fake
        finally:
            await fake.shutdown()
            bus.disconnect()
